"""scripts/demo.sh, scripts/bootstrap.sh and scripts/test.sh against stand-ins for python3, pip,
apt-get and id (root): the demo installs hacfed alone and never touches apt; the test command adds
the test tools and installs Chromium; a current stamp installs nothing."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ("bash", "cat", "sha256sum", "cut", "dirname")  # the only programs the scripts run besides the stand-ins


@pytest.fixture
def fake(tmp_path) -> dict[str, Path]:
    """A PATH with only the stand-ins and TOOLS (so no real chromium is found), each stand-in
    appending its command line to `log`."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    for tool in TOOLS:
        (bin_dir / tool).symlink_to(shutil.which(tool))

    def stand_in(path: Path, name: str, extra: str = "") -> None:
        path.write_text(f'#!/bin/bash\necho "{name} $*" >> "{log}"\n{extra}')
        path.chmod(0o755)

    venv_tools = "".join(f'    printf \'#!/bin/bash\\necho "{t} $*" >> "{log}"\\n\' > "$3/bin/{t}"; '
                         f'/bin/chmod +x "$3/bin/{t}"\n' for t in ("python", "ruff", "hacfed"))
    stand_in(bin_dir / "python3", "python3", 'if [ "$1" = --version ]; then echo "Python 3.11.9"; fi\n'
             f'if [ "$1 $2" = "-m venv" ]; then\n    /bin/mkdir -p "$3/bin"\n{venv_tools}fi\n')
    stand_in(bin_dir / "apt-get", "apt-get")
    stand_in(bin_dir / "id", "id", "echo 0\n")
    return {"bin": bin_dir, "log": log, "venv": tmp_path / "venv"}


def run(fake: dict[str, Path], script: str, *args: str) -> list[str]:
    """The stand-ins' calls of one run of `script` (apt-get and pip installs; `id` left out)."""
    before = fake["log"].read_text().splitlines() if fake["log"].exists() else []
    env = {"PATH": str(fake["bin"]), "PYTHON": str(fake["bin"] / "python3"), "HACFED_VENV": str(fake["venv"]),
           "HOME": str(fake["venv"].parent)}
    result = subprocess.run(["/bin/bash", str(ROOT / "scripts" / script), *args], env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    calls = fake["log"].read_text().splitlines() if fake["log"].exists() else []
    return [c for c in calls[len(before):] if not c.startswith("id ")]


def test_the_demo_installs_hacfed_alone_and_never_runs_apt(fake):
    calls = run(fake, "demo.sh", "--rounds", "3")
    assert not [c for c in calls if c.startswith("apt-get")], calls
    installs = [c for c in calls if c.startswith("python -m pip install")]
    assert any(c.endswith(" -e .") for c in installs) and not any("[test]" in c for c in installs), installs
    assert all("--no-compile" in c for c in installs), installs
    assert calls[-1] == "hacfed demo --rounds 3"
    assert run(fake, "demo.sh") == ["hacfed demo"]  # the stamp is current: nothing installed


def test_the_test_command_adds_the_test_tools_and_chromium(fake):
    run(fake, "demo.sh")
    calls = run(fake, "test.sh", "-q")
    installs = [c for c in calls if c.startswith("python -m pip install")]
    assert any(c.endswith(' -e .[test]') for c in installs), installs
    assert any(c.endswith("-e examples/hacfed-task-example") for c in installs), installs
    assert "apt-get install -y -qq chromium" in calls, calls
    assert calls[-1].startswith("python -m pytest -m not gpu and not vllm and not long")
    again = run(fake, "test.sh")
    assert not [c for c in again if c.startswith("python -m pip")], again  # the test layer is current
    assert run(fake, "demo.sh") == ["hacfed demo"]  # and it holds the demo's
