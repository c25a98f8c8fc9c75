"""`round_join = "newest"` over real Flower: two hacfed-client processes, one at `--slowdown 4`
(docs/staleness.md "Joining the newest round").

hacfed-server (K = 2) and two tiny-llama labs on loopback, as in test_staleness_flower.py but without a
kill: lab-a (full speed) joins the newest round or opens the next one as soon as its submission is in,
lab-b (four times slower) joins the newest round whenever it is done and skips the others.

What is checked, from the journal: lab-a rolled out every round and ran ahead (it was sent some step
t + 1 before round t closed); lab-b took fewer rounds; each round waited for the labs that took it and
closed at quorum; every submission a lab was sent, it was sent once (the journal's key) and at most K
rounds old, and lab-a was sent every submission of lab-b; both labs ended normally.
"""

from __future__ import annotations

import re

import pytest

from tests.federation import TRACE, Federation
from tests.integration.slowed_pair import LABS, server_toml
from tests.processes import running_descendants

ROUNDS = 6
K = 2
FACTOR = 4
SERVER_TOML = server_toml("it-join", ROUNDS, max_staleness=K, round_join="newest")


@pytest.mark.slow
def test_newest_frees_the_fast_lab_and_sends_every_sample_at_most_once_and_k_rounds_old(tmp_path, zoo_presets):
    zoo_presets("tiny-llama")
    fed = Federation(tmp_path)
    fed.env["OMP_NUM_THREADS"] = "1"
    fed.configure(SERVER_TOML)
    before = running_descendants()
    passed = False
    try:
        server = fed.start(())
        lab_a = fed.lab("lab-a", "tiny-llama")
        lab_b = fed.lab("lab-b", "tiny-llama", extra=("--eval-problems", "4", "--slowdown", str(FACTOR)))
        assert server.exit_code(900) == 0, server.text()[-5000:]
        assert lab_a.exit_code(180) == 0, lab_a.text()[-5000:]
        assert lab_b.exit_code(180) == 0, lab_b.text()[-5000:]
        passed = True
    finally:
        fed.teardown(before, strict=passed)
    view = fed
    text = server.text()
    assert f"federation finished: {ROUNDS} rounds, final reports from ['lab-a', 'lab-b']" in text, text[-3000:]
    for pid, lab in (("lab-a", lab_a), ("lab-b", lab_b)):
        assert re.search(rf"the federation is done: the coordinator closed run it-join for {pid}", lab.text()), pid
        assert not TRACE.search(lab.text()), lab.text()[-3000:]
    assert not TRACE.search(text), text[-3000:]

    # -- who took which round: lab-a every one, lab-b fewer; each round closed at quorum with its takers
    steps = {pid: [s for (s,) in view.rows("SELECT step FROM sent_steps WHERE participant_id=? ORDER BY step", pid)]
             for pid in LABS}
    assert steps["lab-a"] == list(range(ROUNDS + 1)), steps
    assert steps["lab-b"][0] == 0 and steps["lab-b"][-1] == ROUNDS and len(steps["lab-b"]) < ROUNDS + 1, steps
    for q in range(ROUNDS):
        takers = {pid for pid in LABS if q in steps[pid]}
        submitters = {p for (p,) in view.rows("SELECT participant_id FROM submissions WHERE round_id=?", q)}
        assert submitters == takers, (q, submitters, takers)
    closed = view.rows("SELECT round_id, close_reason, below_quorum FROM rounds ORDER BY round_id")
    assert closed == [(q, "quorum", 0) for q in range(ROUNDS)], closed
    assert view.rows("SELECT COUNT(*) FROM rejections") == [(0,)]

    # -- what each lab was sent: each submission once (the journal's key), at most K rounds old
    submitted = set(view.rows("SELECT round_id, participant_id FROM submissions"))
    for pid in LABS:
        sent = view.rows("SELECT step, round_id, source_id FROM sent_sources WHERE participant_id=?", pid)
        pairs = [(q, source) for _, q, source in sent]
        assert len(pairs) == len(set(pairs)) and set(pairs) <= submitted, (pid, sent)
        assert all(0 <= step - 1 - q <= K for step, q, _ in sent), (pid, sent)
    to_a = {(q, s) for _, q, s in view.rows("SELECT step, round_id, source_id FROM sent_sources "
                                           "WHERE participant_id='lab-a'")}
    assert {(q, s) for q, s in submitted if s == "lab-b"} <= to_a  # lab-a was sent every one of lab-b's

    # -- lab-a ran ahead: sent step t + 1 while round t was still open
    ahead = view.rows("SELECT s.step FROM sent_steps s JOIN rounds r ON r.round_id = s.step - 1 "
                      "WHERE s.participant_id='lab-a' AND s.step < ? AND s.sent_at < r.closed_at", ROUNDS)
    print(f"\nsteps taken: {steps}; lab-a was sent steps {[t for (t,) in ahead]} before the round before them closed")
    assert ahead, steps
