"""The demo presets ship warmed up: `hacfed/models/presets/NAME/` holds each one as the store
publishes it (Hugging Face files plus `hacfed_model.json`), so a first demo copies three small
directories instead of running three warm-ups.

    python scripts/build_presets.py            # rebuild them from their recipes (same seed, same bytes)
    python scripts/build_presets.py --check    # rebuild in a temp dir and compare, changing nothing

`hacfed.models.store.ensure_built` copies a shipped preset into the cache when the recipe hash
recorded beside it is the current recipe's; otherwise (a recipe changed without a rebuild, another
seed, `--force`) it warms the preset up from scratch as before. Torch-free.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

from hacfed.models.model_dir import METADATA_FILE

# The three presets `hacfed demo` runs by default (hacfed.tools.demo.DEFAULT_AGENTS).
SHIPPED_PRESETS = ("tiny-llama", "tiny-gpt2", "tiny-qwen2")
SHIPPED_ROOT = Path(__file__).resolve().parent / "presets"
# Metadata the store writes itself when it publishes a copy (hacfed.models.store._build_and_publish).
_PUBLISHED_FIELDS = ("preset", "seed", "recipe_hash", "hacfed_version", "build_seconds")


def shipped_dir(name: str) -> Path:
    return SHIPPED_ROOT / name


def current_copy(name: str, seed: int, expected_hash: str) -> Path | None:
    """The shipped directory of `name` when it is this build (seed 0, the current recipe's hash)."""
    if seed != 0 or name not in SHIPPED_PRESETS:
        return None
    meta = read_shipped_metadata(name)
    if meta is None or meta.get("recipe_hash") != expected_hash:
        return None
    return shipped_dir(name)


def read_shipped_metadata(name: str) -> dict[str, Any] | None:
    return _metadata(shipped_dir(name)) or None


def copier(source: Path) -> Callable[[str, int, Path], dict[str, Any]]:
    """A store builder that copies the shipped directory `source` instead of warming up."""

    def copy(name: str, seed: int, out: Path) -> dict[str, Any]:
        for file in sorted(source.iterdir()):
            if file.is_file() and file.name != METADATA_FILE:
                shutil.copyfile(file, out / file.name)
        meta = json.loads((source / METADATA_FILE).read_text())
        return {**{k: v for k, v in meta.items() if k not in _PUBLISHED_FIELDS}, "shipped": True}

    return copy


def differences(built: Path, shipped: Path) -> list[str]:
    """What differs between a fresh build and a shipped copy: each file's bytes (the metadata
    aside, whose timings always differ) and the metadata's recipe hash, steps and accuracy."""
    ours, theirs = _model_files(built), _model_files(shipped)
    found = [f"{name}: only in the build" for name in sorted(ours - theirs)]
    found += [f"{name}: only in the shipped copy" for name in sorted(theirs - ours)]
    for name in sorted(ours & theirs):
        if (built / name).read_bytes() != (shipped / name).read_bytes():
            found.append(f"{name}: bytes differ")
    new, old = _metadata(built), _metadata(shipped)
    for key in ("recipe_hash", "warmup_steps", "heldout_accuracy"):
        if new.get(key) != old.get(key):
            found.append(f"{METADATA_FILE} {key}: {old.get(key)!r} shipped, {new.get(key)!r} built")
    return found


def _model_files(root: Path) -> set[str]:
    return {p.name for p in root.iterdir() if p.is_file() and p.name != METADATA_FILE} if root.is_dir() else set()


def _metadata(root: Path) -> dict[str, Any]:
    file = root / METADATA_FILE
    return json.loads(file.read_text()) if file.is_file() else {}
