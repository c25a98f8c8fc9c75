"""`hacfed models export NAME DIR`: any model hacfed loads, written as a plain Hugging Face directory.

    export_model("smollm2", Path("models/smollm2"))   # de-quantized GGUF -> safetensors + tokenizer

The directory holds `config.json` without a quantization config, the weights as safetensors, the
generation config and the tokenizer with its chat template, so `AutoModelForCausalLM.from_pretrained`
and TRL's GRPOTrainer take it as an ordinary model (a GGUF-loaded one still carries the GGUF
quantization config, which TRL refuses as "purely quantized"), and `hacfed-client --model DIR` or
`hacfed sim --agents DIR,...` load it as a local directory. The weights are the ones hacfed trains
(the model as `load_model` prepares it: no dropout, a pad token).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from hacfed.models.gguf import forget_quantization
from hacfed.models.loading import load_model


@dataclass(frozen=True)
class Exported:
    directory: Path
    parameters: int
    dtype: str


def export_model(spec: str, directory: Path, dtype: str | None = None) -> Exported:
    """Load `spec` as hacfed does and save it to `directory`, which must be absent or empty."""
    directory = Path(directory).expanduser()
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise ValueError(f"{directory} already exists and is not an empty directory; choose a new one")
    loaded = load_model(spec, dtype=dtype, progress=False)
    model = loaded.model
    forget_quantization(model)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    loaded.tokenizer.save_pretrained(directory)
    parameters = sum(p.numel() for p in model.parameters())
    dtypes = {p.dtype for p in model.parameters()}
    return Exported(directory, parameters, ", ".join(sorted(str(d).removeprefix("torch.") for d in dtypes)))


def is_quantized(model: torch.nn.Module) -> bool:
    """Whether transformers (and so TRL) would treat `model` as quantized."""
    return bool(getattr(model, "is_quantized", False) or getattr(model.config, "quantization_config", None))
