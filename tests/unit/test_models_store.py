"""The model cache protocol: publish atomically, build once, survive crashes and concurrent builders.

Builders here are stand-ins that write a file instead of training, so the tests are hermetic and fast.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import platformdirs
import pytest

from hacfed.models import store

HASH = "recipe-v1"


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("HACFED_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def fake_builder(log: list[str]):
    def build(name: str, seed: int, out: Path) -> dict:
        log.append(name)
        (out / "config.json").write_text("{}")
        return {"heldout_accuracy": 0.4, "warmup_steps": 12}

    return build


def leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith((".tmp-", ".old-")))


def test_home_from_env_else_platform_cache(home, monkeypatch):
    assert store.model_dir("tiny-llama") == home / "models" / "tiny-llama"
    assert store.model_dir("tiny-llama", seed=3) == home / "models" / "tiny-llama-seed3"
    monkeypatch.delenv("HACFED_HOME")
    assert store.hacfed_home() == Path(platformdirs.user_cache_dir("hacfed"))
    with pytest.raises(ValueError, match="seed must be an int >= 0"):
        store.cache_key("x", -1)


def test_build_publishes_metadata_and_is_reused(home):
    log: list[str] = []
    path = store.ensure_built("m", builder=fake_builder(log), expected_hash=HASH, progress=False)
    assert path == home / "models" / "m" and (path / "config.json").is_file()
    meta = store.read_metadata(path)
    assert meta["preset"] == "m" and meta["seed"] == 0 and meta["recipe_hash"] == HASH
    assert meta["heldout_accuracy"] == 0.4 and meta["warmup_steps"] == 12 and "hacfed_version" in meta
    assert store.ensure_built("m", builder=fake_builder(log), expected_hash=HASH) == path
    assert log == ["m"]  # cached: built once
    assert leftovers(path.parent) == []


def test_force_and_changed_recipe_rebuild(home):
    log: list[str] = []
    path = store.ensure_built("m", builder=fake_builder(log), expected_hash=HASH)
    store.ensure_built("m", builder=fake_builder(log), expected_hash=HASH, force=True)
    store.ensure_built("m", builder=fake_builder(log), expected_hash="recipe-v2")
    assert log == ["m", "m", "m"]
    assert store.read_metadata(path)["recipe_hash"] == "recipe-v2"
    assert leftovers(path.parent) == []


def test_failed_build_leaves_nothing_and_keeps_the_old_copy(home):
    def crashing(name, seed, out):
        (out / "model.safetensors").write_text("half-written")
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError, match="out of memory"):
        store.ensure_built("m", builder=crashing, expected_hash=HASH)
    root = home / "models"
    assert not (root / "m").exists() and leftovers(root) == []
    # A failed forced rebuild keeps the published copy intact.
    store.ensure_built("m", builder=fake_builder([]), expected_hash=HASH)
    with pytest.raises(RuntimeError):
        store.ensure_built("m", builder=crashing, expected_hash=HASH, force=True)
    assert store.read_metadata(root / "m")["recipe_hash"] == HASH
    assert not (root / "m" / "model.safetensors").exists()


_CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from hacfed.models import store

    log, go = Path(sys.argv[1]), Path(sys.argv[2])

    def build(name, seed, out):
        with log.open("a") as f:
            f.write("build\\n")
        (out / "config.json").write_text("{}")
        deadline = time.monotonic() + 600
        while not go.exists() and time.monotonic() < deadline:  # the test decides when we finish
            time.sleep(0.02)
        return {"heldout_accuracy": 0.4}

    path = store.ensure_built("m", builder=build, expected_hash="recipe-v1")
    print(store.read_metadata(path)["recipe_hash"])
    """
)


def _spawn(tmp_path: Path, tag: str) -> tuple[subprocess.Popen, Path]:
    err = tmp_path / f"stderr-{tag}"
    with err.open("w") as err_file:
        proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(tmp_path / "log"), str(tmp_path / "go")],
            stdout=subprocess.PIPE, stderr=err_file, text=True, env=os.environ.copy(), start_new_session=True,
        )
    return proc, err


def _wait_for(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.05)


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def test_killed_builder_leaves_no_cache_dir_and_next_build_cleans_up(home, tmp_path):
    proc, _ = _spawn(tmp_path, "a")
    try:
        _wait_for(lambda: _read(tmp_path / "log") == "build\n")  # mid-build, holding the lock
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.communicate(timeout=30)
    root = home / "models"
    assert not (root / "m").exists()
    assert len(leftovers(root)) == 1  # the dead builder's temp dir, never published
    path = store.ensure_built("m", builder=fake_builder([]), expected_hash=HASH)  # lock was released
    assert store.read_metadata(path)["recipe_hash"] == HASH
    assert leftovers(root) == []


def test_concurrent_builders_build_once(home, tmp_path):
    (a, err_a), (b, err_b) = _spawn(tmp_path, "a"), _spawn(tmp_path, "b")
    try:
        # One builds (holding the lock) while the other is blocked on the lock, then both go on.
        _wait_for(lambda: _read(tmp_path / "log") == "build\n"
                  and any("waiting for another process building m" in _read(e) for e in (err_a, err_b)))
        (tmp_path / "go").touch()
        outputs = [proc.communicate(timeout=120)[0].strip() for proc in (a, b)]
    finally:
        for proc in (a, b):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
    assert [a.returncode, b.returncode] == [0, 0], (_read(err_a), _read(err_b))
    assert outputs == ["recipe-v1", "recipe-v1"]
    assert _read(tmp_path / "log") == "build\n"  # the waiting process reused the published build
    meta = json.loads((home / "models" / "m" / store.METADATA_FILE).read_text())
    assert meta["heldout_accuracy"] == 0.4
