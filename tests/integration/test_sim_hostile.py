"""`hacfed sim` with each weak or hostile lab beside an honest one, through the real coordinator: the hostile
lab's samples are accepted into the pool the honest learner trains on, and the honest metrics rows exist
(with `eval_canary_rate` when a canary lab runs)."""

from __future__ import annotations

import pytest

from hacfed.tools.sim import TASKS, SimConfig, run_sim

pytestmark = pytest.mark.slow

PROMPTS, G = 2, 2
RUNS = [  # (hostile agent, mode, task, budget)
    ("hostile:copy-gold", "xhacpo", "add2", 6),
    ("hostile:weak", "hacpo", "add2", 6),
    ("hostile:lie-logprob", "naive", "add2", 6),
    ("hostile:canary:see-evil.example", "xhacpo", "chain", 40),
]


def test_each_hostile_kind_reaches_the_honest_learners_pool(tmp_path):
    for n, (agent, mode, task, budget) in enumerate(RUNS):
        cfg = SimConfig(agents=("tiny-llama", agent), mode=mode, rounds=2, seed=0, prompts_per_round=PROMPTS,
                        group_size=G, max_new_tokens=budget, eval_every=0, eval_problems=4,
                        task=dict(TASKS[task][0]), state_dir=str(tmp_path / f"coord-{n}"))
        rows = run_sim(cfg, tmp_path / f"metrics-{n}.jsonl", progress=False)
        bad = [r for r in rows if r["agent"].startswith("hostile-") and not r.get("final")]
        assert len(bad) == 2 and all(r["accepted"] == PROMPTS * G and r["rejected"] == 0 for r in bad), (agent, bad)
        honest = [r for r in rows if r["agent"] == "tiny-llama"]
        trained = [r for r in honest if "train/num_samples" in r]
        # The whole pool (its own samples and the hostile lab's) reached the honest learner, the groups its
        # text filter left out counted (the canary's lines break the chain format).
        assert trained and all(r["train/num_samples"] + r["train/skipped_views"] + r["train/skipped_filter"]
                               == 2 * PROMPTS * G for r in trained), (agent, trained)
        evaluated = [r for r in honest if "eval_accuracy" in r]
        assert any(r.get("final") for r in evaluated), agent
        has_rate = ["eval_canary_rate" in r for r in evaluated]
        assert all(has_rate) if "canary" in agent else not any(has_rate), (agent, evaluated)
        assert all(0.0 <= r.get("eval_canary_rate", 0.0) <= 1.0 for r in evaluated)
