"""deploy/coordinator-requirements.txt agrees with pyproject.toml and is enough for hacfed.server.

hacfed-server runs from a site-packages holding only the listed distributions and their dependencies
(nothing else importable), and GSM8K loads once coordinator-data-requirements.txt is added.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.unit.deploy_files import DEPLOY, REPO

# ----------------------------------------------------------------------------------------------
# deploy/coordinator-requirements.txt: the coordinator image's dependencies.


def coordinator_requirements(name: str = "coordinator-requirements.txt") -> list[Requirement]:
    lines = (DEPLOY / name).read_text().splitlines()
    return [Requirement(line) for line in lines if line.strip() and not line.lstrip().startswith("#")]


def test_coordinator_requirements_repeat_pyprojects_specifiers() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pinned = {canonicalize_name(r.name): r for r in map(Requirement, project["dependencies"])}
    for req in [*coordinator_requirements(), *coordinator_requirements("coordinator-data-requirements.txt")]:
        name = canonicalize_name(req.name)
        assert name in pinned, f"{req} is not a dependency in pyproject.toml"
        assert req.specifier == pinned[name].specifier and req.extras == pinned[name].extras, (req, pinned[name])
    names = {canonicalize_name(r.name) for r in coordinator_requirements()}
    assert not names & {"torch", "transformers", "datasets", "peft", "accelerate", "tokenizers"}


def dependency_closure(requirements: list[Requirement]) -> set[str]:
    """The installed distributions `requirements` pull in, recursively (as pip would resolve them)."""
    seen: set[str] = set()
    todo = [(r, frozenset(r.extras)) for r in requirements]
    while todo:
        req, extras = todo.pop()
        name = canonicalize_name(req.name)
        key = f"{name}[{','.join(sorted(extras))}]"
        if key in seen:
            continue
        seen.add(key)
        for text in metadata.requires(req.name) or []:
            dep = Requirement(text)
            if dep.marker is None or any(dep.marker.evaluate({"extra": e}) for e in ["", *extras]):
                todo.append((dep, frozenset(dep.extras)))
    return {k.split("[")[0] for k in seen}


def isolated_site(root: Path, requirements: list[Requirement]) -> Path:
    """A site-packages folder holding only what the coordinator image would: symlinks to the
    installed distributions of `requirements` and their dependencies (packages, modules and
    .dist-info), and hacfed laid out as `pip install --no-deps .` installs it."""
    closure, site = dependency_closure(requirements), root / "site-packages"
    site.mkdir(parents=True)
    for dist in metadata.distributions():
        if canonicalize_name(dist.metadata["Name"]) not in closure:
            continue
        for file in dist.files or []:
            top = file.parts[0]
            if top in ("..", "__pycache__") or top.endswith(".pth") or (site / top).exists():
                continue
            if top.endswith(".dist-info") or len(file.parts) > 1 or top.endswith((".py", ".so")):
                (site / top).symlink_to(dist.locate_file(top))
    hacfed = site / "hacfed"
    hacfed.mkdir()
    for child in (REPO / "hacfed").iterdir():
        if child.name != "__pycache__":
            (hacfed / child.name).symlink_to(child)
    for name in ("server", "clients", "proto"):  # pyproject.toml's package-dir
        (hacfed / name).symlink_to(REPO / name)
    return site


ISOLATED_RUN = r"""
import sys
site, tmp, deploy = sys.argv[1:4]
# Only the standard library and the isolated site: as in the image, where nothing else is installed.
sys.path[:] = [p for p in sys.path if p and "site-packages" not in p and p != "."] + [site]
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__ + repr(f)]
sys.path_hooks[:] = [h for h in sys.path_hooks if "editable" not in repr(h).lower()]
sys.path_importer_cache.clear()
import importlib, importlib.metadata, importlib.util, json, pkgutil
assert importlib.util.find_spec("torch") is None and importlib.util.find_spec("transformers") is None
import hacfed.server
assert hacfed.server.__file__.startswith(site), hacfed.server.__file__
names = [m.name for m in pkgutil.walk_packages(hacfed.server.__path__, "hacfed.server.")]
assert {"hacfed.server.main", "hacfed.server.serverapp", "hacfed.server.driver"} <= set(names), names
for name in [*names, "hacfed.clients.enrol", "hacfed.clients.main"]:
    importlib.import_module(name)
import uvicorn  # hacfed.server.dashboard.serve imports it when hacfed-server runs with --dashboard
from hacfed.server.main import main
assert main(["certs", "init", "--dir", tmp + "/certs", "--hosts", "coordinator"]) == 0
from hacfed.clients.main import main as client_main
assert client_main(["keys", "--state-dir", tmp + "/lab-a", "--participant-id", "lab-a"]) == 0
from hacfed.server.config import load_server_config
from hacfed.server.runner import check_before_writing
tls = {"tls_cert": tmp + "/certs/server.pem", "tls_key": tmp + "/certs/server.key", "tls_ca": tmp + "/certs/ca.pem"}
check_before_writing(load_server_config(deploy + "/coordinator.toml", [], {"state_dir": tmp + "/state", **tls}))
from math_verify import parse, verify  # the verifier's sandboxed worker imports it
assert verify(parse("$\\frac{1}{2}$"), parse("$0.5$"))
from hacfed.tasks.registry import load_task
try:  # the commented-out GSM8K [task] of deploy/coordinator.toml
    load_task({"kind": "jsonl", "name": "gsm8k", "train_files": ["../hacfed/data/gsm8k/train.jsonl"],
               "eval_files": ["../hacfed/data/gsm8k/test.jsonl"], "answer_format": "gsm8k"}, deploy).train_problems()
    data_task = "loaded"
except ModuleNotFoundError as exc:
    data_task = f"needs {exc.name}"
assert "torch" not in sys.modules and "transformers" not in sys.modules
by_module = importlib.metadata.packages_distributions()
dists = sorted({d for m in list(sys.modules) for d in by_module.get(m.partition(".")[0], [])})
print(json.dumps({"dists": dists, "data_task": data_task}))
"""


def isolated_run(requirements: list[Requirement], tmp_path: Path) -> dict:
    site = isolated_site(tmp_path, requirements)
    assert (site / "flwr").exists() and not (site / "torch").exists() and not (site / "transformers").exists()
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf")}  # datasets' cache, which the image keeps in HACFED_HOME
    result = subprocess.run([sys.executable, "-c", ISOLATED_RUN, str(site), str(work), str(DEPLOY)],
                            capture_output=True, text=True, timeout=600, cwd=work, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_hacfed_server_runs_with_only_the_coordinator_requirements(tmp_path: Path) -> None:
    report = isolated_run(coordinator_requirements(), tmp_path)
    # Every listed requirement is used: the image carries nothing hacfed-server does not import.
    imported = {canonicalize_name(d) for d in report["dists"]}
    assert {canonicalize_name(r.name) for r in coordinator_requirements()} <= imported, imported
    # A task read from files (GSM8K) needs `datasets`: the image's DATA_TASKS=1 variant adds it.
    assert report["data_task"] == "needs datasets", report


def test_the_data_tasks_variant_loads_gsm8k_without_torch(tmp_path: Path) -> None:
    extra = coordinator_requirements("coordinator-data-requirements.txt")
    report = isolated_run([*coordinator_requirements(), *extra], tmp_path)
    assert report["data_task"] == "loaded", report
    assert {canonicalize_name(r.name) for r in extra} <= {canonicalize_name(d) for d in report["dists"]}
