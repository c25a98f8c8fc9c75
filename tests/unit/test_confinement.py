"""The check that keeps the suite honest about a fresh clone (tests/confine/hacfed_confine.py): a
test that reads a sibling directory of the clone fails, in the pytest process and in any process it starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.confine.hacfed_confine import Confinement, make_config

CONFINE_DIR = Path(__file__).resolve().parents[1] / "confine"


def test_rules_clone_specific_roots_siblings_and_general_roots(tmp_path: Path) -> None:
    outer = tmp_path / "outer"
    (outer / "clone").mkdir(parents=True)
    (outer / "shared").mkdir()
    (outer / "clone-other").mkdir()
    venv = outer / "venv"  # a specific root beside the clone stays allowed
    venv.mkdir()
    rules = Confinement(make_config(str(outer / "clone"), [str(venv), str(tmp_path)], general=[str(tmp_path), "/proc"]),
                        str(tmp_path))
    assert rules.allowed(str(outer / "clone" / "data" / "x.jsonl"))
    assert rules.allowed(str(venv / "lib" / "site.py"))
    assert rules.allowed("/proc/self/status")
    # beside the clone, although inside a specific root (pytest's temporary directory) that holds the clone
    assert not rules.allowed(str(outer / "shared" / "data" / "train.jsonl"))
    assert not rules.allowed(str(outer / "shared"))
    assert rules.allowed(str(outer / "made-later"))  # not there at the start: a temporary file of this run
    assert rules.allowed(str(tmp_path / "elsewhere"))
    assert not rules.allowed("/opt/data.txt") and not rules.allowed(str(Path.home() / ".cache" / "x"))
    assert not rules.allowed(str(outer / "clone-other"))  # a prefix of the clone's name is not the clone


_FAKE_TESTS = '''
import os, subprocess, sys
from pathlib import Path

SHARED = Path(__file__).resolve().parents[1] / "shared"

def test_reads_the_sibling():
    assert (SHARED / "data.txt").read_text() == "secret"

def test_a_child_process_reads_the_sibling():
    subprocess.run([sys.executable, "-c", f"open({str(SHARED / 'data.txt')!r}).read()"], check=True)

def test_lists_the_sibling():
    assert os.listdir(SHARED) == ["data.txt"]

def test_clean(tmp_path):
    assert Path(__file__).read_text()
    (tmp_path / "out.txt").write_text("fine")
    try:
        open(SHARED / "missing.txt")  # a probe of a file that is not there reads nothing
    except FileNotFoundError:
        pass
'''


def _run_fake_session(tmp_path: Path, *args: str, tests: str = _FAKE_TESTS,
                      **env_extra: str) -> subprocess.CompletedProcess[str]:
    outer = tmp_path / "outer"
    repo = outer / "repo"
    repo.mkdir(parents=True)
    (outer / "shared").mkdir(exist_ok=True)
    (outer / "shared" / "data.txt").write_text("secret")
    (repo / "pytest.ini").write_text("[pytest]\n")
    (repo / "test_fake.py").write_text(textwrap.dedent(tests))
    env = dict(os.environ, **{"HACFED_TEST_CONFINE": "1", **env_extra})  # on, even where the outer run has it off
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(CONFINE_DIR), env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "hacfed_confine", "-q", "-p", "no:cacheprovider",
                           "--basetemp", str(tmp_path / "inner-tmp"), *args, "test_fake.py"],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=300)


def test_a_session_that_reads_beside_the_clone_fails_and_names_the_test_and_path(tmp_path: Path) -> None:
    result = _run_fake_session(tmp_path)
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    shared = str(tmp_path / "outer" / "shared")
    for test in ("test_reads_the_sibling", "test_a_child_process_reads_the_sibling", "test_lists_the_sibling"):
        assert f"ERROR test_fake.py::{test}" in out, out
    assert "ERROR test_fake.py::test_clean" not in out and "missing.txt" not in out
    assert f"open {shared}/data.txt   [test_fake.py::test_reads_the_sibling (call)]" in out
    assert f"open {shared}/data.txt   [test_fake.py::test_a_child_process_reads_the_sibling (call)]" in out
    assert f"os.listdir {shared}   [test_fake.py::test_lists_the_sibling (call)]" in out
    assert "files outside the clone" in out and "4 passed, 3 errors" in out


def test_a_session_split_over_workers_still_fails_on_a_read_beside_the_clone(tmp_path: Path) -> None:
    """scripts/test.sh runs the suite on two pytest-xdist workers: the workers inherit the audit hook
    (sitecustomize on PYTHONPATH) and the controller's session fails on what they logged."""
    result = _run_fake_session(tmp_path, "-n", "2")
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    shared = str(tmp_path / "outer" / "shared")
    assert "files outside the clone" in out, out
    for test in ("test_reads_the_sibling", "test_a_child_process_reads_the_sibling", "test_lists_the_sibling"):
        assert f"{shared}" in out and f"[test_fake.py::{test} (call)]" in out, out


def test_the_check_can_be_switched_off(tmp_path: Path) -> None:
    result = _run_fake_session(tmp_path, HACFED_TEST_CONFINE="0")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "files outside the clone" not in result.stdout


_TASK_PACKAGE_TESTS = '''
from pathlib import Path

import mytask

SOURCE = Path(mytask.__file__).resolve().parents[2]

def test_imports_and_reads_the_installed_task_package():
    assert mytask.WORD == "apple" and (SOURCE / "pyproject.toml").read_text()

def test_writes_into_the_installed_task_package():
    (SOURCE / "written-by-a-test.txt").write_text("no")
'''


def test_an_editable_task_package_beside_the_clone_may_be_read_not_written(tmp_path: Path) -> None:
    """A lab's own task package installed with `pip install -e` from outside the clone (README, "Your
    own task") belongs to the environment: the suite reads it (imports, data) without a violation,
    and a write into it is still one (issue 43)."""
    outer = tmp_path / "outer"
    source = outer / "my-task"  # beside the clone, where the README's reader keeps it
    (source / "src" / "mytask").mkdir(parents=True)
    (source / "pyproject.toml").write_text("[project]\nname = 'mytask'\n")
    (source / "src" / "mytask" / "__init__.py").write_text("WORD = 'apple'\n")
    site = tmp_path / "site"  # what pip writes: the dist-info with PEP 610's direct_url.json
    info = site / "mytask-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mytask\nVersion: 0.1\n")
    (info / "direct_url.json").write_text(json.dumps({"url": source.as_uri(), "dir_info": {"editable": True}}))
    paths = os.pathsep.join(p for p in (str(site), str(source / "src"), os.environ.get("PYTHONPATH")) if p)
    result = _run_fake_session(tmp_path, tests=_TASK_PACKAGE_TESTS, PYTHONPATH=paths)
    out = result.stdout + result.stderr
    assert "ERROR test_fake.py::test_imports_and_reads_the_installed_task_package" not in out, out
    assert f"open {source}/written-by-a-test.txt   [test_fake.py::test_writes_into_the_installed_task_package" \
        in out, out
    assert "2 passed, 1 error" in out, out
