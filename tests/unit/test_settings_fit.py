"""Settings no round could run under are refused at hacfed-server's start-up, in one line, exit 2,
before any file is created (security.md N5: prompts_per_round = 10^9 and group_size = 10^9 reached
"ready"). The refusals run the real `hacfed-server` process on deploy/coordinator.toml."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hacfed.server.config import load_server_config
from hacfed.server.coordinator import load_task_from_config
from hacfed.server.coordinator.settings_fit import check_settings_fit

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DEPLOY = REPO / "deploy" / "coordinator.toml"


def _server(state: Path, *sets: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess:
    """hacfed-server in its own process group, ended by its pid if it outlives the timeout (then the test fails)."""
    argv = [str(BIN / "hacfed-server"), "--config", str(DEPLOY), "--insecure", "--listen", "127.0.0.1:0",
            "--state-dir", str(state), *(a for s in sets for a in ("--set", s))]
    proc = subprocess.Popen(argv, cwd=state.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"hacfed-server {' '.join(sets)} was still running after {timeout_s:.0f} s instead of refusing")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


@pytest.mark.parametrize(("setting", "named"), [
    ("prompts_per_round=1000000000", "prompts_per_round = 1000000000: exceeds the task's 4000 train problems"),
    ("group_size=1000000000", "group_size = 1000000000: a full submission of prompts_per_round x group_size"),
    ("max_submission_bytes=1000000000000", "max_submission_bytes = 1000000000000: exceeds the per-message cap"),
    ("sampling.max_new_tokens=1000000000", "sampling.max_new_tokens = 1000000000: more than max_response_chars"),
])
def test_hacfed_server_refuses_a_setting_that_cannot_fit_before_creating_anything(
    tmp_path: Path, setting: str, named: str,
) -> None:
    state = tmp_path / "state"
    done = _server(state, setting)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith(f"hacfed-server: error: {named}"), done.stderr
    assert len(done.stderr.splitlines()) == 1 and done.stdout == "", done.stdout + done.stderr
    assert not state.exists()


def test_the_deploy_settings_and_their_largest_fitting_group_pass(tmp_path: Path) -> None:
    cfg = load_server_config(DEPLOY, [], {"state_dir": str(tmp_path / "state"), "insecure": True}).coordinator
    task = load_task_from_config(cfg, str(DEPLOY.parent))
    check_settings_fit(cfg, task)
    with pytest.raises(ValueError, match=r"set group_size to at most (\d+)") as refused:
        check_settings_fit(cfg.with_overrides({"group_size": 10**9}), task)
    most = int(str(refused.value).rsplit(" ", 1)[1])
    check_settings_fit(cfg.with_overrides({"group_size": most}), task)
    with pytest.raises(ValueError, match=f"group_size = {most + 1}"):
        check_settings_fit(cfg.with_overrides({"group_size": most + 1}), task)
    assert not (tmp_path / "state").exists()
