"""Bounded staleness over real Flower: `max_staleness = 1`, one lab at `hacfed-client --slowdown 4`,
the coordinator killed with SIGKILL mid-run and started again (docs/staleness.md).

hacfed-server and two hacfed-client processes on loopback, as in test_slowdown_flower.py (K = 0),
with K = 1: lab-a (full speed) is sent its step t + 1 as soon as its step t submission is in and
round t - 1 has closed, without waiting for lab-b's step t. Once lab-a has been sent step 3 while
round 2 is still open (so two rounds are open and a journaled step is in flight), the whole
coordinator is killed (tests/faults/conftest.py's `kill_tree`) and started again with the same command.

What is checked: every round closed at quorum with both labs' samples; every receipt a lab holds is in
the journal exactly once and nothing unreceipted is (`check_receipts_in_journal`); both labs end
normally; from the journaled deliveries (`sent_steps`, `sent_sources`) each lab was sent every
submission of every round exactly once and none older than K rounds; and K = 1 acted: lab-a was sent
some step t + 1 before round t closed (the journal's `sent_at` against the round's `closed_at`),
which a synchronous driver never does.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.faults.conftest import TRACE
from tests.faults.conftest import Federation as JournalView
from tests.integration.test_federation_flower import Federation, _running_descendants, _still_running, wait_nothing_left

ROUNDS = 5
K = 1
KILL_AT_STEP = 3  # killed once lab-a was sent this step while round KILL_AT_STEP - 1 is still open
FACTOR = 4
SERVER_TOML = f"""
run_id = "it-staleness"
rounds = {ROUNDS}
max_staleness = {K}
prompts_per_round = 2
group_size = 2
expected_participants = 2
min_participants = 2
round_deadline_s = 600
eval_every = 0
state_dir = "server"
[task]
kind = "arithmetic"
digits = 2
operators = "+"
[sampling]
max_new_tokens = 6
"""
LABS = ("lab-a", "lab-b")  # lab-b is the slowed one


def _wait_ahead(view: JournalView, step: int, timeout: float = 300.0) -> list[str]:
    """Wait until lab-a was sent `step` while round `step - 1` is open; returns the rounds' states then."""
    deadline = time.monotonic() + timeout
    while True:
        sent = view.rows("SELECT COUNT(*) FROM sent_steps WHERE participant_id='lab-a' AND step=?", step)
        state = view.rows("SELECT state FROM rounds WHERE round_id=?", step - 1)
        if sent == [(1,)] and state == [("OPEN",)]:
            return [s for (s,) in view.rows("SELECT state FROM rounds ORDER BY round_id")]
        assert time.monotonic() < deadline, f"lab-a was not sent step {step} while round {step - 1} was open"
        time.sleep(0.05)


@pytest.mark.slow
def test_k1_with_a_lab_at_slowdown_4_runs_ahead_and_survives_a_coordinator_kill(
        tmp_path: Path, zoo_presets: Callable[..., None]) -> None:
    zoo_presets("tiny-llama")
    fed = Federation(tmp_path, SERVER_TOML)
    fed.env["OMP_NUM_THREADS"] = "1"
    view = JournalView(tmp_path, fed.env)  # the fault suite's readers of the journal and the labs' outboxes
    before = _running_descendants()
    try:
        first = fed.server("127.0.0.1:0", "server-1.log")
        fed.address = first.wait_for(r"hacfed-server: ready: Fleet API on (127\.0\.0\.1:\d+)").group(1)
        lab_a = fed.client("lab-a", "tiny-llama", extra=("--eval-problems", "4"))
        lab_b = fed.client("lab-b", "tiny-llama", extra=("--eval-problems", "4", "--slowdown", str(FACTOR)))
        states = _wait_ahead(view, KILL_AT_STEP)
        view.kill_tree(first)  # kill -9 of hacfed-server, its SuperLink and its ServerApp
        killed = set(view.seen)
        second = fed.server("127.0.0.1:0", "server-2.log")  # the same command
        assert second.wait_for(r"ready: Fleet API on (\S+) ").group(1) == fed.address
        assert second.exit_code(600) == 0, second.text()[-5000:]
        assert lab_a.exit_code(180) == 0, lab_a.text()[-5000:]
        assert lab_b.exit_code(180) == 0, lab_b.text()[-5000:]
    finally:
        fed.stop_all()
    wait_nothing_left(before)
    assert _still_running(killed) == set()

    # -- the kill came with two rounds open
    assert states[KILL_AT_STEP - 1:] == ["OPEN", "OPEN"], states
    text2 = second.text()
    assert re.search(rf"coordinator ready \(run it-staleness\): round {KILL_AT_STEP} continues", text2), text2[-3000:]
    assert f"federation finished: {ROUNDS} rounds, final reports from ['lab-a', 'lab-b']" in text2

    # -- every round closed at quorum; both labs' samples in every round, none refused
    rounds = view.rows("SELECT round_id, state, close_reason FROM rounds ORDER BY round_id")
    assert [(r, reason) for r, state, reason in rounds if state != "OPEN"] == [(r, "quorum") for r in range(ROUNDS)]
    per_lab_round = view.rows("SELECT participant_id, round_id, COUNT(*) FROM trajectories "
                              "GROUP BY participant_id, round_id")
    assert sorted(per_lab_round) == [(pid, r, 2 * 2) for pid in LABS for r in range(ROUNDS)]
    assert view.rows("SELECT COUNT(*) FROM rejections") == [(0,)]
    assert view.rows("SELECT COUNT(*) FROM strikes") == [(0,)]
    assert view.integrity() == "ok"

    # -- receipts: exactly once in the journal, nothing there without one; each lab ended normally
    assert view.check_receipts_in_journal(list(LABS)) == {pid: ROUNDS * 2 * 2 for pid in LABS}
    for pid, lab in (("lab-a", lab_a), ("lab-b", lab_b)):
        assert re.search(rf"the federation is done: the coordinator closed run it-staleness for {pid}; "
                         r"final held-out accuracy \d\.\d{3}; checkpoints in \S+\. Exiting\.", lab.text()), pid
        assert not TRACE.search(lab.text()), lab.text()[-3000:]
    for server in (first, second):
        assert not TRACE.search(server.text()), server.text()[-3000:]

    # -- deliveries: every submission reaches each lab once, at a staleness of at most K
    steps = view.rows("SELECT participant_id, step FROM sent_steps ORDER BY 1, 2")
    assert steps == [(pid, t) for pid in LABS for t in range(ROUNDS + 1)]
    submitted = sorted(view.rows("SELECT round_id, participant_id FROM submissions ORDER BY 1, 2"))
    staleness = {}
    for pid in LABS:
        sent = view.rows("SELECT step, round_id, source_id FROM sent_sources WHERE participant_id=?", pid)
        assert all(0 <= step - 1 - q <= K for step, q, _ in sent), (pid, sent)
        assert sorted((q, source) for _, q, source in sent) == submitted, (pid, sent)
        staleness[pid] = sorted(step - 1 - q for step, q, source in sent if source != pid)

    # -- K = 1 acted: lab-a started some step t + 1 before round t closed
    ahead = view.rows("SELECT s.step FROM sent_steps s JOIN rounds r ON r.round_id = s.step - 1 "
                      "WHERE s.participant_id='lab-a' AND s.step < ? AND s.sent_at < r.closed_at", ROUNDS)
    print(f"\nlab-a was sent steps {[t for (t,) in ahead]} before the round before them closed; staleness of "
          f"the peer submissions each lab was sent: {staleness}")
    assert len(ahead) >= 2, ahead
    assert "max_staleness 1" in first.text()
