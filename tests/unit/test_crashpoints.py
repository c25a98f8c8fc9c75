"""HACFED_CRASH_AT hooks (for the fault suite, security.md R1): each point exits the process at
exactly its place, and the journal shows the state that place implies after a restart."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hacfed.crashpoints import CRASH_EXIT_CODE, POINTS, crash_point
from tests.unit.test_coordinator_fakes import make_coordinator

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {repo!r})
    from tests.unit.test_coordinator_fakes import make_coordinator, scripted_submission
    c = make_coordinator({state!r})
    c.register("a")
    c.register("b")
    plan = c.open_round(0)
    print("submitting", flush=True)
    c.submit(scripted_submission(plan, "a", nonce="a" * 32))
    print("submitted", flush=True)
    c.submit(scripted_submission(plan, "a", nonce="a" * 32))  # the identical resend: its stored result
    c.submit(scripted_submission(plan, "b", nonce="b" * 32))
    c.close_round("quorum")
    print("closed", flush=True)
""")


def _run(tmp_path: Path, point: str | None) -> subprocess.CompletedProcess:
    env = {**os.environ, "HACFED_CRASH_AT": point or ""}
    code = SCRIPT.format(repo=str(REPO), state=str(tmp_path))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)


@pytest.mark.parametrize(
    ("point", "printed", "submissions", "state"),
    [
        ("before_commit", "submitting", 0, "OPEN"),  # the rows and the audit line were written, not committed
        ("after_commit_before_ack", "submitting", 1, "OPEN"),  # committed, the caller never got the result
        ("after_commit_before_ack@2", "submitted", 2, "OPEN"),  # the 2nd commit (b's), not the resend
        ("mid_round_close", "submitted", 2, "OPEN"),  # the CLOSED row was written, not committed
        (None, "closed", 2, "CLOSED"),
    ],
)
def test_crash_point_exits_at_its_place(tmp_path, point, printed, submissions, state):
    result = _run(tmp_path, point)
    if point is None:
        assert result.returncode == 0, result.stderr
    else:
        assert result.returncode == CRASH_EXIT_CODE, result.stderr
        assert f"HACFED_CRASH_AT={point}: crashing at {point.split('@')[0]}" in result.stderr
    assert result.stdout.strip().splitlines()[-1] == printed
    revived = make_coordinator(tmp_path)  # a restart: what did the journal keep?
    assert revived.journal.count("submissions") == submissions
    assert revived.journal.pragma("integrity_check") == "ok"
    assert revived.journal.round(0).state == state


def test_points_are_a_closed_set(monkeypatch):
    monkeypatch.setenv("HACFED_CRASH_AT", "before_commit")
    crash_point("mid_checkpoint")  # another point: nothing happens
    with pytest.raises(ValueError, match="unknown crash point"):
        crash_point("somewhere")
    assert set(POINTS) == {"before_commit", "after_commit_before_ack", "after_ack", "mid_round_close", "mid_checkpoint"}


def test_a_stop_point_holds_the_process_there_until_sigcont():
    import signal
    import time

    import psutil

    script = "from hacfed.crashpoints import crash_point\nprint('before', flush=True)\n" \
             "crash_point('mid_checkpoint')\ncrash_point('mid_checkpoint')\nprint('after', flush=True)\n"
    env = {**os.environ, "HACFED_STOP_AT": "mid_checkpoint@2", "HACFED_CRASH_AT": ""}
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=REPO, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while psutil.Process(proc.pid).status() != psutil.STATUS_STOPPED:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGCONT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err
    assert out.split() == ["before", "after"]
    assert "HACFED_STOP_AT=mid_checkpoint@2: stopped at mid_checkpoint" in err  # the 2nd hit, not the 1st
    assert err.count("stopped at") == 1
