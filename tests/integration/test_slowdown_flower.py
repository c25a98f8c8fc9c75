"""A lab at `hacfed-client --slowdown 4` in a real federation: hacfed-server and two hacfed-client
processes over Flower on loopback (docs/staleness.md).

lab-a and lab-b run the same preset and settings; lab-b is started with `--slowdown 4`, so after each
step's checkpoint it sleeps 3 x the step's rollout and training seconds before it replies. The rounds
are synchronous (K = 0): each one waits for lab-b. In round 2, once lab-a's submission is in the
journal and lab-b's is not (lab-b is still computing or sleeping), the whole coordinator is killed
with SIGKILL (tests/faults/conftest.py's `kill_tree`) and started again with the same command: it
must resume the open round, take lab-b's late reply and finish.

What is checked: every round closed at quorum with both labs' samples, every receipt a lab holds is
in the journal exactly once and nothing unreceipted is (the fault suite's `check_receipts_in_journal`),
both labs end normally, and lab-b's replies really come later: from the journal's times (a
submission's `received_at` after its round's `opened_at`), the sum over the measured rounds of
lab-b's delay behind lab-a is at least 1.5 x lab-b's own reported compute time (the sleep adds 3 x;
without it the two identical labs differ by noise only), and lab-b's summed reply latency is at
least 1.3 x lab-a's. Both are ratios within one run, so the machine's speed cancels out. Rounds 0
(the labs start at different moments) and 2 (the kill) are left out of the timing.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.faults.conftest import TRACE
from tests.faults.conftest import Federation as JournalView
from tests.integration.test_federation_flower import Federation, _running_descendants, _still_running, wait_nothing_left

ROUNDS = 5
KILLED_ROUND = 2
TIMED_ROUNDS = (1, 3, 4)
FACTOR = 4
SERVER_TOML = f"""
run_id = "it-slowdown"
rounds = {ROUNDS}
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


def _wait_fast_lab_submitted_first(view: JournalView, round_id: int, timeout: float = 300.0) -> list[str]:
    """Wait until lab-a's submission for `round_id` is committed; returns who had submitted then."""
    deadline = time.monotonic() + timeout
    while True:
        who = [pid for (pid,) in view.rows("SELECT participant_id FROM submissions WHERE round_id=?", round_id)]
        if "lab-a" in who:
            return who
        assert time.monotonic() < deadline, f"no submission of lab-a for round {round_id} within {timeout}s"
        time.sleep(0.05)


def _reply_latencies(view: JournalView) -> dict[str, dict[int, float]]:
    """Per lab and round: seconds from the round's opening to the coordinator's receipt of its submission."""
    opened = dict(view.rows("SELECT round_id, opened_at FROM rounds"))
    latency: dict[str, dict[int, float]] = {pid: {} for pid in LABS}
    for pid, round_id, at in view.rows("SELECT participant_id, round_id, received_at FROM submissions"):
        latency[pid][round_id] = at - opened[round_id]
    return latency


def _compute_seconds(metrics: Path, pid: str) -> dict[int, float]:
    """Per round: the lab's rollout + training (+ checkpoint) seconds, as its report gave them."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    return {r["round"]: r["time_rollout_s"] + r["time_training_s"] for r in rows
            if r["agent"] == pid and not r.get("final") and "time_rollout_s" in r}


@pytest.mark.slow
def test_a_lab_at_slowdown_4_replies_later_and_survives_a_coordinator_kill(
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
        first.wait_for(rf"round {KILLED_ROUND - 1} closed", timeout=300)
        submitted = _wait_fast_lab_submitted_first(view, KILLED_ROUND)
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

    # -- the kill came while lab-b's reply to the open round was still pending
    assert submitted == ["lab-a"], submitted
    text2 = second.text()
    assert re.search(rf"coordinator ready \(run it-slowdown\): round {KILLED_ROUND} continues", text2), text2[-3000:]
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
        assert re.search(r"round \d: receipt seq \d+ \(content [0-9a-f]{12}\): accepted 4", lab.text()), pid
        assert re.search(rf"the federation is done: the coordinator closed run it-slowdown for {pid}; "
                         r"final held-out accuracy \d\.\d{3}; checkpoints in \S+\. Exiting\.", lab.text()), pid
        assert not TRACE.search(lab.text()), lab.text()[-3000:]
    assert f"slowdown {FACTOR}: every step waits {FACTOR - 1} x its rollout and training time" in lab_b.text()
    assert "hacfed-client: slowdown" not in lab_a.text()
    for server in (first, second):
        assert not TRACE.search(server.text()), server.text()[-3000:]

    # -- lab-b's replies come later, by a margin only its slowdown explains
    latency = _reply_latencies(view)
    compute_b = _compute_seconds(tmp_path / "metrics.jsonl", "lab-b")
    assert set(TIMED_ROUNDS) <= set(compute_b), compute_b
    fast = sum(latency["lab-a"][r] for r in TIMED_ROUNDS)
    slow = sum(latency["lab-b"][r] for r in TIMED_ROUNDS)
    own = sum(compute_b[r] for r in TIMED_ROUNDS)
    summary = (f"reply latency over rounds {TIMED_ROUNDS}: lab-a {fast:.2f}s, lab-b {slow:.2f}s "
               f"(lab-b's compute {own:.2f}s); per round {latency}")
    print(f"\n{summary}")
    assert slow - fast >= 1.5 * own, summary  # the sleep adds (4 - 1) x own
    assert slow >= 1.3 * fast, summary
