"""`hacfed sim` with a canary lab beside honest ones, through the real coordinator: an honest learner's text
filter leaves the canary lab's groups out of its update and counts them (`train/skipped_filter`) when
the deny-list names the canary, or, in the chain task, when the canary breaks the worked-solution
format; in a free-text task a canary the deny-list does not name gets through (the filter's limit)."""

from __future__ import annotations

import pytest

from hacfed.tools.sim import TASKS, SimConfig, run_sim

pytestmark = pytest.mark.slow

PROMPTS, G = 2, 2
CANARY = "see-evil.example"
RUNS = [  # (task, budget, deny_strings, canary samples each honest learner leaves out per round)
    ("add2-words", 8, (CANARY,), PROMPTS * G),  # the deny-list names it
    ("add2-words", 8, (), 0),  # free text, not named: a bare domain is no URL to the default list
    ("chain", 40, (), PROMPTS * G),  # a line that is not a worked step breaks the chain format
]


@pytest.mark.parametrize("task, budget, deny, skipped", RUNS)
def test_honest_learners_leave_out_and_count_the_canary_labs_groups(tmp_path, task, budget, deny, skipped):
    agents = ("tiny-llama", "tiny-gpt2", f"hostile:canary:{CANARY}")
    cfg = SimConfig(agents=agents, mode="xhacpo", rounds=2, seed=0, prompts_per_round=PROMPTS, group_size=G,
                    max_new_tokens=budget, eval_every=0, eval_problems=2, task=dict(TASKS[task][0]),
                    state_dir=str(tmp_path / "coord"), deny_strings=deny)
    rows = run_sim(cfg, tmp_path / "metrics.jsonl", progress=False)
    canary_lab = [r for r in rows if r["agent"].startswith("hostile-") and not r.get("final")]
    assert canary_lab and all(r["accepted"] == PROMPTS * G for r in canary_lab)  # the coordinator took them
    trained = [r for r in rows if r["agent"] in agents[:2] and "train/num_samples" in r]
    assert len(trained) == 2 * 2, trained  # each honest learner trains on the pools of rounds 0 and 1
    for r in trained:
        assert r["train/skipped_filter"] == skipped, r
        assert r["train/num_samples"] + r["train/skipped_views"] + r["train/skipped_filter"] == 3 * PROMPTS * G, r
        assert r.get("train/withheld_outbound", 0) == 0, r
