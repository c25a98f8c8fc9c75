"""Bounded staleness over real Flower: `max_staleness = 1`, one lab at `hacfed-client --slowdown 8`,
the coordinator killed with SIGKILL mid-run and started again (docs/staleness.md).

hacfed-server and two hacfed-client processes on loopback, as in test_slowdown_flower.py (K = 0),
with K = 1: lab-a (full speed) is sent its step t + 1 as soon as its step t submission is in and
round t - 1 has closed, without waiting for lab-b's step t. Once lab-a has been sent step 3 while
round 2 is still open (so two rounds are open and a journaled step is in flight), the whole
coordinator is killed (tests/federation.py's `kill_tree`) and started again with the same command.

What is checked: every round closed at quorum with both labs' samples; every receipt a lab holds is in
the journal exactly once and nothing unreceipted is (`check_receipts_in_journal`); both labs end
normally; from the journaled deliveries (`sent_steps`, `sent_sources`) each lab was sent every
submission of every round exactly once and none older than K rounds; and K = 1 acted: lab-a was sent
some step t + 1 before round t closed (the journal's `sent_at` against the round's `closed_at`),
which a synchronous driver never does.
"""

from __future__ import annotations

import time

import pytest

from tests.federation import Federation
from tests.integration.slowed_pair import LABS, check_finished_run, run_with_a_kill, server_toml

ROUNDS = 5
K = 1
KILL_AT_STEP = 3  # killed once lab-a was sent this step while round KILL_AT_STEP - 1 is still open
FACTOR = 8
SERVER_TOML = server_toml("it-staleness", ROUNDS, max_staleness=K)


def _wait_ahead(view: Federation, step: int, timeout: float = 300.0) -> list[str]:
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
def test_k1_with_a_lab_at_slowdown_8_runs_ahead_and_survives_a_coordinator_kill(tmp_path, zoo_presets) -> None:
    zoo_presets("tiny-llama")
    run = run_with_a_kill(tmp_path, SERVER_TOML, FACTOR, lambda view, first: _wait_ahead(view, KILL_AT_STEP))
    view, states = run.view, run.before_kill

    # -- the kill came with two rounds open; the run resumed and ended as every slowed-pair run must
    assert states[KILL_AT_STEP - 1:] == ["OPEN", "OPEN"], states
    check_finished_run(run, "it-staleness", ROUNDS, continued_round=KILL_AT_STEP)

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
    # The step before the kill is ahead by construction (`_wait_ahead`, which times out if K = 1 never
    # acts); on a loaded machine lab-a's own compute can stretch past lab-b's sleep, so the other
    # steps need not be ahead (seen in CI: only step 3).
    assert (KILL_AT_STEP,) in ahead, ahead
    assert "max_staleness 1" in run.first.text()
