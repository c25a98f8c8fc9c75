"""Atomic participant checkpoints: temp dir, fsync every file, rename, fsync the parent.

Layout: <dir>/ckpt-<round:06d>/{model/, optimizer.pt, state.json, rng.pt} and <dir>/LATEST naming the
newest complete checkpoint. A crash at any point leaves either the previous or the new checkpoint,
never a partial one. Only our own files are ever loaded with torch.load (never peer data).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: Path) -> None:
    for root, _dirs, files in os.walk(path):
        for name in files:
            with open(Path(root) / name, "rb+") as fh:
                os.fsync(fh.fileno())
        fsync_dir(Path(root))


def atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def save_checkpoint(directory: Path, round_id: int, write: Any, keep: int = 2) -> Path:
    """`write(tmp_dir)` fills a fresh directory; it becomes ckpt-<round> atomically, then LATEST."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"ckpt-{round_id:06d}"
    tmp = Path(tempfile.mkdtemp(dir=directory, prefix=".tmp-ckpt-"))
    try:
        write(tmp)
        fsync_tree(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
        fsync_dir(directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    atomic_write_text(directory / "LATEST", final.name + "\n")
    _prune(directory, keep, final.name)
    return final


def latest_checkpoint(directory: Path) -> Path | None:
    pointer = Path(directory) / "LATEST"
    if not pointer.exists():
        return None
    path = Path(directory) / pointer.read_text().strip()
    if not (path / "state.json").exists():
        raise ValueError(f"checkpoint pointer {pointer} names {path.name}, which is incomplete or missing")
    return path


def read_state(path: Path) -> dict:
    return json.loads((Path(path) / "state.json").read_text())


def _prune(directory: Path, keep: int, newest: str) -> None:
    ckpts = sorted(p for p in directory.glob("ckpt-*") if p.is_dir())
    for stale in ckpts[:-keep]:
        if stale.name != newest:
            shutil.rmtree(stale, ignore_errors=True)
    for tmp in directory.glob(".tmp-ckpt-*"):
        shutil.rmtree(tmp, ignore_errors=True)
