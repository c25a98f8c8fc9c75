"""On-disk cache of built zoo models: one normal Hugging Face directory per preset (and seed).

    path = ensure_built("tiny-gpt2")      # warms up and caches on first use, then returns at once
    AutoModelForCausalLM.from_pretrained(path)

Layout: `$HACFED_HOME/models/NAME/` (default home: `platformdirs.user_cache_dir("hacfed")`), holding
`save_pretrained` output of model and tokenizer plus `hacfed_model.json` (preset, seed, task,
warm-up steps, held-out accuracy, hacfed version, recipe hash).

A build is atomic: it happens in a temporary directory beside the target (same filesystem), every
file is fsynced, and one `rename` publishes it. A per-name `flock` serializes builders, so two
processes asking for the same preset build it once and never see a partial directory; a crashed
build leaves only a temp dir, which the next builder removes. A cache whose recipe no longer
matches the preset's (code changed) is rebuilt. Torch is imported only when a build runs. The demo
presets ship warmed up (hacfed.models.shipped): their first use copies them instead of training.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import platformdirs

import hacfed
from hacfed.models.model_dir import METADATA_FILE

_TMP_PREFIX = ".tmp-"
_OLD_PREFIX = ".old-"

# (preset name, seed, output directory) -> metadata to record; writes the HF files into the dir.
Builder = Callable[[str, int, Path], dict[str, Any]]


def hacfed_home() -> Path:
    """Root of hacfed's cache: `$HACFED_HOME`, else the platform's user cache dir."""
    env = os.environ.get("HACFED_HOME")
    return Path(env).expanduser() if env else Path(platformdirs.user_cache_dir("hacfed"))


def models_root() -> Path:
    return hacfed_home() / "models"


def cache_key(name: str, seed: int = 0) -> str:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")
    return name if seed == 0 else f"{name}-seed{seed}"


def model_dir(name: str, seed: int = 0) -> Path:
    return models_root() / cache_key(name, seed)


def recipe_hash(recipe: dict[str, Any]) -> str:
    """Stable hash of everything that determines a build (preset, task, seed)."""
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def read_metadata(path: Path) -> dict[str, Any] | None:
    """The metadata of a published cache dir, or None when there is none."""
    file = Path(path) / METADATA_FILE
    if not file.is_file():
        return None
    return json.loads(file.read_text())


def is_current(path: Path, expected_hash: str) -> bool:
    meta = read_metadata(path)
    return meta is not None and meta.get("recipe_hash") == expected_hash


def ensure_built(
    name: str,
    seed: int = 0,
    *,
    force: bool = False,
    progress: bool = True,
    builder: Builder | None = None,
    expected_hash: str | None = None,
) -> Path:
    """Directory of preset `name` built with `seed`, building (and caching) it if needed.

    `builder`/`expected_hash` default to the zoo's build and its recipe hash: a copy of the preset
    shipped with hacfed when one exists for this recipe (hacfed.models.shipped), else the warm-up;
    `force` always warms up. Tests pass stand-ins to exercise the cache protocol without training.
    """
    if builder is None or expected_hash is None:
        from hacfed.models import shipped, zoo  # zoo imports torch: only when a zoo build may be needed

        if expected_hash is None:
            expected_hash = recipe_hash(zoo.preset_recipe(name, seed))
        if builder is None:
            source = None if force else shipped.current_copy(name, seed, expected_hash)
            builder = shipped.copier(source) if source else functools.partial(zoo.build_warmed_up, progress=progress)
    target = model_dir(name, seed)
    if not force and is_current(target, expected_hash):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(target.parent / f".{target.name}.lock", target.name):
        if not force and is_current(target, expected_hash):  # another process built it meanwhile
            return target
        _remove_leftovers(target)
        if target.exists():
            reason = "--force" if force else "its recipe changed"
            print(f"[hacfed] rebuilding {target.name} ({reason})", file=sys.stderr)
        _build_and_publish(name, seed, target, builder, expected_hash)
    return target


def _build_and_publish(name: str, seed: int, target: Path, builder: Builder, expected_hash: str) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{target.name}-", dir=target.parent))
    try:
        started = time.monotonic()
        meta = dict(builder(name, seed, tmp))
        meta.update(
            preset=name, seed=seed, recipe_hash=expected_hash, hacfed_version=hacfed.__version__,
            build_seconds=round(time.monotonic() - started, 3),
        )
        (tmp / METADATA_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the published cache is readable like any other
        _fsync_tree(tmp)
        if target.exists():  # replace: move the old one aside, publish, then delete the old one
            old = Path(tempfile.mkdtemp(prefix=f"{_OLD_PREFIX}{target.name}-", dir=target.parent))
            os.rename(target, old / "dir")
            os.rename(tmp, target)
            shutil.rmtree(old)
        else:
            os.rename(tmp, target)
        _fsync_dir(target.parent)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def _remove_leftovers(target: Path) -> None:
    """Temp dirs of crashed builds of this name (safe: the caller holds this name's lock)."""
    for prefix in (_TMP_PREFIX, _OLD_PREFIX):
        for leftover in target.parent.glob(f"{prefix}{target.name}-*"):
            shutil.rmtree(leftover)


def _fsync_tree(root: Path) -> None:
    for dirpath, _dirnames, filenames in os.walk(root):
        for filename in filenames:
            fd = os.open(os.path.join(dirpath, filename), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def _exclusive_lock(lock_path: Path, label: str) -> Iterator[None]:
    """flock on a lock file; released by the kernel even if the process dies."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"[hacfed] waiting for another process building {label}", file=sys.stderr)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
