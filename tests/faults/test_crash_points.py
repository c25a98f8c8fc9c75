"""The coordinator dies at each journal crash point and is restarted (issue 9; security.md R1).

One federation of two labs (hacfed-server and two hacfed-client processes on loopback) lives through
four coordinator deaths, one per `HACFED_CRASH_AT` point in the order a submission meets them:

  before_commit            a submission's rows are written, COMMIT is next
  after_commit_before_ack  the submission is committed, its receipt not yet built
  after_ack                a lab's reply proved it holds its receipts; the rest of the reply is unread
  mid_round_close          the round's CLOSED row is written, COMMIT is next

Each life of hacfed-server gets the next point in its environment; the ServerApp (which holds the
journal) exits at that point with `os._exit` (no cleanup, as kill -9), and the test then kills
hacfed-server itself with SIGKILL, by pid, and starts it again with the same command. After every
crash the journal passes `PRAGMA integrity_check` and shows the state the point implies; at the end
the run has finished, every trajectory a lab holds a signed receipt for is in the journal exactly
once (and the journal holds none without one), every lab's outbox is fully acknowledged, and the
round cut at mid_round_close continued with the same id and deadline.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import psutil
import pytest

from hacfed.crashpoints import CRASH_ENV, CRASH_EXIT_CODE
from tests.faults.conftest import fault_toml
from tests.federation import TRACE, Federation
from tests.processes import Proc

pytestmark = pytest.mark.slow

POINTS = ("before_commit", "after_commit_before_ack", "after_ack", "mid_round_close")
LABS = ("lab-a", "lab-b")
ROUNDS = 3


def _serverapp_crash(server: Proc) -> int | None:
    """The exit status of a ServerApp of this hacfed-server that has exited and is not yet reaped.

    Flower starts the ServerApp with its output sent to /dev/null, so the crash point's line on
    stderr is lost; its exit status (CRASH_EXIT_CODE) is not: the SuperExec reaps an app only when it
    starts the next one, and the kernel shows a zombie's status (/proc/PID/stat, field 52)."""
    try:
        tree = psutil.Process(server.popen.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return None
    for proc in tree:
        try:
            if proc.name() == "flwr-serverapp" and proc.status() == psutil.STATUS_ZOMBIE:
                fields = Path(f"/proc/{proc.pid}/stat").read_text().rpartition(")")[2].split()
                return int(fields[49]) >> 8
        except (psutil.NoSuchProcess, FileNotFoundError):
            continue
    return None


def _wait_for_crash(fed: Federation, server: Proc, point: str, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while (code := _serverapp_crash(server)) is None:
        assert time.monotonic() < deadline, f"the ServerApp did not crash at {point} within {timeout}s"
        assert server.popen.poll() is None, server.text()[-3000:]
        for pid, lab in fed.labs.items():
            assert lab.popen.poll() is None, f"{pid} exited:\n{lab.text()[-3000:]}"
        time.sleep(0.05)
    assert code == CRASH_EXIT_CODE, f"the ServerApp exited with {code}, not at {point}"


def test_every_crash_point_then_restart_keeps_each_receipt_exactly_once(federation: Federation) -> None:
    fed = federation
    fed.configure(fault_toml("faults-crash", rounds=ROUNDS, expected=2, minimum=2, deadline_s=600))
    server = fed.start(LABS, {CRASH_ENV: POINTS[0]})
    cut: tuple[int, float] | None = None  # the round cut by mid_round_close: (id, deadline)
    restart_s: list[float] = []  # from each restart to the ServerApp's "coordinator ready"
    for life, point in enumerate(POINTS, start=1):
        _wait_for_crash(fed, server, point)
        fed.kill(server)  # kill -9 hacfed-server; its SuperLink's guard ends it (or the restart does)
        assert fed.integrity() == "ok", point
        submissions = fed.rows("SELECT seq, participant_id, round_id, nonce FROM submissions ORDER BY seq")
        pending = {pid: [e for e in fed.outbox(pid) if e["state"] == "pending"] for pid in LABS}
        if point == "before_commit":  # the first submission of the run: written, never committed
            assert submissions == []
            assert any(e["sends"] >= 1 for entries in pending.values() for e in entries), pending
        elif point == "after_commit_before_ack":  # committed, but the lab never got a receipt
            _, pid, _, nonce = submissions[-1]
            assert nonce in {e["nonce"] for e in pending[pid]}, (submissions, pending)
        elif point == "after_ack":  # the lab settled the receipts its reply acknowledged
            assert any(e["state"] == "acked" for pid in LABS for e in fed.outbox(pid))
        elif point == "mid_round_close":  # the CLOSED row was not committed: the round is still open
            (round_id, state, deadline), = fed.rows(
                "SELECT round_id, state, deadline FROM rounds ORDER BY round_id DESC LIMIT 1")
            assert state == "OPEN"
            assert {p for (p,) in fed.rows("SELECT participant_id FROM submissions WHERE round_id=?", round_id)} \
                == set(LABS)
            cut = (round_id, deadline)
        following = {CRASH_ENV: POINTS[life]} if life < len(POINTS) else {}
        restarted = time.monotonic()
        server = fed.server(f"server-{life + 1}.log", following)
        fed.console(server, r"coordinator ready \(run faults-crash\): ")  # the ServerApp has resumed the journal
        restart_s.append(round(time.monotonic() - restarted, 1))
        if re.search(r"superlink \(pid \d+\) left running", server.text()):  # its guard had not ended it yet
            assert re.search(r"stopped superlink \(pid \d+\) left running by a previous hacfed-server", server.text())
    assert server.exit_code(400) == 0, server.text()[-5000:]
    for pid in LABS:
        assert fed.labs[pid].exit_code(120) == 0, fed.labs[pid].text()[-3000:]

    # -- the round cut at mid_round_close continued with the same id and deadline, then closed
    assert cut is not None
    assert f"round {cut[0]} continues (same id and deadline)" in server.text()
    (deadline, state), = fed.rows("SELECT deadline, state FROM rounds WHERE round_id=?", cut[0])
    assert deadline == cut[1] and state != "OPEN"

    # -- the journal: intact, every round once and closed, one submission per lab and round
    assert fed.integrity() == "ok"
    assert [r for (r,) in fed.rows("SELECT round_id FROM rounds WHERE state != 'OPEN' ORDER BY round_id")] \
        == list(range(ROUNDS))
    per_round = fed.rows("SELECT participant_id, round_id, COUNT(*) FROM submissions GROUP BY participant_id, round_id")
    assert sorted(per_round) == [(pid, r, 1) for pid in LABS for r in range(ROUNDS)]
    assert fed.rows("SELECT participant_id, code FROM rejections") == []

    # -- each lab: every receipt's trajectories in the journal exactly once, nothing unacknowledged
    counts = fed.check_receipts_in_journal(list(LABS))
    assert counts == {pid: ROUNDS * 2 * 2 for pid in LABS}
    for pid in LABS:
        states = [e["state"] for e in fed.outbox(pid)]
        assert states == ["acked"] * (ROUNDS + 1), (pid, states)  # the rounds and the final report
        assert not TRACE.search(fed.labs[pid].text())
    print(f"\nrestart to 'coordinator ready' after each crash: {dict(zip(POINTS, restart_s, strict=True))} s")
