"""Packaging: console scripts exist and no generic top-level names (server, clients, proto) are installed."""

from __future__ import annotations

import importlib
import importlib.metadata as md
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hacfed.models.shipped import SHIPPED_PRESETS

ROOT = Path(__file__).resolve().parents[2]


def test_console_scripts_declared():
    scripts = {
        ep.name: ep.value for ep in md.entry_points(group="console_scripts") if ep.dist and ep.dist.name == "hacfed"
    }
    assert scripts == {
        "hacfed": "hacfed.tools.cli:main",
        "hacfed-server": "hacfed.server.main:main",
        "hacfed-client": "hacfed.clients.main:main",
    }


@pytest.mark.parametrize("generic", ["server", "clients", "proto"])
def test_no_generic_top_level_package(generic, tmp_path):
    # Run from an empty directory so the repository root is not on sys.path.
    code = f"import importlib.util, sys; sys.exit(0 if importlib.util.find_spec({generic!r}) is None else 1)"
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path)
    assert result.returncode == 0, f"a top-level package {generic!r} is importable from site-packages"


def test_folders_map_into_the_hacfed_namespace():
    for name, folder in (("hacfed.server", "server"), ("hacfed.clients", "clients"), ("hacfed.proto", "proto")):
        spec = importlib.util.find_spec(name)
        assert spec is not None and Path(spec.origin).parent == ROOT / folder


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "./scripts/test.sh" in readme and "./scripts/test.sh" in ci
    commands = [line for line in ci.splitlines() if line.strip() and not line.startswith("#")]
    assert commands[-1] == "./scripts/test.sh"
    assert "export HACFED_TEST_CONFINE=1" in commands  # tests/conftest.py: no test reads outside the clone


def test_flower_app_components_name_the_server_and_client_apps():
    import tomllib

    from hacfed.server.superlink import APP_DIR

    components = tomllib.loads((APP_DIR / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["components"]
    assert components == {"serverapp": "hacfed.server.serverapp:app", "clientapp": "hacfed.clients.clientapp:app"}
    for spec in components.values():
        module, _, attr = spec.partition(":")
        assert getattr(importlib.import_module(module), attr) is not None


def _copy_sources(dest: Path) -> None:
    import shutil

    files = subprocess.run(["git", "ls-files", "-z", "pyproject.toml", "README.md", "LICENSE", "hacfed", "server",
                            "clients", "proto"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, (f.decode() for f in files)):
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / name, dest / name)


def test_wheel_builds_without_warnings_and_carries_the_data_and_licences(tmp_path):
    """A real (non-editable) build: setuptools prints none of its warnings about our configuration
    (licence format, a data folder treated as a package), and the wheel holds GSM8K with its MIT
    licence, the Flower app file, the shipped demo presets and the project licence."""
    import zipfile

    src, out = tmp_path / "src", tmp_path / "out"
    _copy_sources(src)
    # Without this machine's pip configuration: nothing but the copied sources and the venv is read.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                             "--no-cache-dir", "--quiet", "-w", str(out), str(src)],
                            capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    noise = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert noise == [], "\n".join(noise[:40])
    (wheel,) = out.glob("hacfed-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in ("hacfed/data/gsm8k/train.jsonl", "hacfed/data/gsm8k/test.jsonl", "hacfed/data/gsm8k/LICENSE",
                 "hacfed/data/gsm8k/README.md", "hacfed/server/flower_app/pyproject.toml",
                 "hacfed/proto/hacfed_v1.proto", *(f"hacfed/models/presets/{name}/{file}" for name in SHIPPED_PRESETS
                                                   for file in ("model.safetensors", "hacfed_model.json"))):
        assert name in names, name
    licences = {n.split("/licenses/", 1)[1] for n in names if "/licenses/" in n}
    assert licences == {"LICENSE", "hacfed/data/gsm8k/LICENSE"}
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    assert "License-Expression: Apache-2.0" in zipfile.ZipFile(wheel).read(metadata).decode()
