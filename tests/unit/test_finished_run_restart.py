"""hacfed-server started again on a state dir whose run is complete says so, where the results are and
what a new run needs, and exits 0 without starting anything (what the README's walk-through hit when
it shared a state dir with an earlier run)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hacfed.server.driver_settings import DONE_FILE

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def test_a_complete_run_is_named_with_its_results_and_nothing_starts(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / DONE_FILE).write_text('{"rounds": 20, "torch_loaded": false}\n')
    proc = subprocess.Popen([str(BIN / "hacfed-server"), "--config", str(REPO / "deploy" / "coordinator.toml"),
                             "--insecure", "--listen", "127.0.0.1:0", "--state-dir", str(state)],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("hacfed-server started a complete run again")
    assert proc.returncode == 0 and err == "", out + err
    assert out.splitlines()[-1] == (f"hacfed-server: the run federation-1 in {state} is already complete; nothing to "
                                    f"do (its metrics: {state / 'metrics.jsonl'}; a new run needs a fresh --state-dir)")
    assert not (state / "superlink").exists()
