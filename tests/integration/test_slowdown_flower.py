"""A lab at `hacfed-client --slowdown 8` in a real federation: hacfed-server and two hacfed-client
processes over Flower on loopback (docs/staleness.md).

lab-a and lab-b run the same preset and settings; lab-b is started with `--slowdown 8`, so after each
step's checkpoint it sleeps 7 x the step's rollout and training seconds before it replies. The rounds
are synchronous (K = 0): each one waits for lab-b. In the first round from round 2 on in which
lab-a's submission is in the journal while lab-b's is not (lab-b is still computing or sleeping),
the whole coordinator is killed with SIGKILL (tests/federation.py's `kill_tree`) and started again
with the same command: it must resume the open round, take lab-b's late reply and finish. A step of
the tiny preset takes about 0.1 s, so on a loaded machine lab-a can lose a round's race to lab-b's
sleep; such a round is passed over (at most one: the kill must come by round 3).

What is checked: every round closed at quorum with both labs' samples, every receipt a lab holds is
in the journal exactly once and nothing unreceipted is (the fault suite's `check_receipts_in_journal`),
both labs end normally, and lab-b's replies really come later: from the journal's times (a
submission's `received_at` after its round's `opened_at`), the sum over the measured rounds of
lab-b's delay behind lab-a is at least 1.5 x lab-b's own reported compute time (the sleep adds 7 x;
without it the two identical labs differ by noise only), and lab-b's summed reply latency is at
least 1.3 x lab-a's. Both are ratios within one run, so the machine's speed cancels out. Round 0
(the labs start at different moments) and the killed round are left out of the timing.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from tests.federation import Federation
from tests.integration.slowed_pair import LABS, check_finished_run, run_with_a_kill, server_toml

ROUNDS = 5
KILLABLE_ROUNDS = (2, 3)
FACTOR = 8
SERVER_TOML = server_toml("it-slowdown", ROUNDS)


def _submitters(view: Federation, round_id: int, timeout: float = 300.0) -> list[str]:
    """Wait until lab-a's submission for `round_id` is committed; returns who had submitted then."""
    deadline = time.monotonic() + timeout
    while True:
        who = [pid for (pid,) in view.rows("SELECT participant_id FROM submissions WHERE round_id=?", round_id)]
        if "lab-a" in who:
            return who
        assert time.monotonic() < deadline, f"no submission of lab-a for round {round_id} within {timeout}s"
        time.sleep(0.01)


def _reply_latencies(view: Federation) -> dict[str, dict[int, float]]:
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


def _kill_when_lab_b_is_pending(view: Federation, first) -> tuple[int, dict[int, list[str]]]:
    """The first killable round in which lab-a had submitted and lab-b had not, and who had
    submitted in each round looked at (module docstring)."""
    first.wait_for(rf"round {KILLABLE_ROUNDS[0] - 1} closed", timeout=300)
    seen: dict[int, list[str]] = {}
    for round_id in KILLABLE_ROUNDS:
        seen[round_id] = _submitters(view, round_id)
        if seen[round_id] == ["lab-a"]:
            return round_id, seen
    raise AssertionError(f"lab-b submitted no later than lab-a in every killable round: {seen}")


@pytest.mark.slow
def test_a_lab_at_slowdown_8_replies_later_and_survives_a_coordinator_kill(tmp_path, zoo_presets) -> None:
    zoo_presets("tiny-llama")
    run = run_with_a_kill(tmp_path, SERVER_TOML, FACTOR, _kill_when_lab_b_is_pending)
    view, lab_a, lab_b = run.view, run.lab_a, run.lab_b

    # -- the kill came while lab-b's reply to the open round was still pending; the run resumed and ended
    killed_round, seen = run.before_kill
    assert seen[killed_round] == ["lab-a"], seen
    check_finished_run(run, "it-slowdown", ROUNDS, continued_round=killed_round)
    for pid, lab in (("lab-a", lab_a), ("lab-b", lab_b)):
        assert re.search(r"round \d: receipt seq \d+ \(content [0-9a-f]{12}\): accepted 4", lab.text()), pid
    assert f"slowdown {FACTOR}: every step waits {FACTOR - 1} x its rollout and training time" in lab_b.text()
    assert "hacfed-client: slowdown" not in lab_a.text()

    # -- lab-b's replies come later, by a margin only its slowdown explains
    timed_rounds = tuple(r for r in range(1, ROUNDS) if r != killed_round)
    latency = _reply_latencies(view)
    compute_b = _compute_seconds(tmp_path / "metrics.jsonl", "lab-b")
    assert set(timed_rounds) <= set(compute_b), compute_b
    fast = sum(latency["lab-a"][r] for r in timed_rounds)
    slow = sum(latency["lab-b"][r] for r in timed_rounds)
    own = sum(compute_b[r] for r in timed_rounds)
    summary = (f"reply latency over rounds {timed_rounds}: lab-a {fast:.2f}s, lab-b {slow:.2f}s "
               f"(lab-b's compute {own:.2f}s); per round {latency}")
    print(f"\n{summary}")
    assert slow - fast >= 1.5 * own, summary  # the sleep adds (8 - 1) x own
    assert slow >= 1.3 * fast, summary
