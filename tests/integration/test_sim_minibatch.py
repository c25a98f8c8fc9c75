"""`hacfed sim --minibatch-size`: the setting reaches every agent's update, so the optimizer steps per
round follow it (the paper's default is 2 per source, 2N per round)."""

from __future__ import annotations

import pytest

from hacfed.tools.sim import SimConfig, run_sim

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(("minibatch", "updates"), [(None, 4), (32, 1), (12, 3)])
def test_minibatch_size_sets_the_updates_per_round(tmp_path, minibatch, updates):
    # 4 prompts x G 4 per agent, two agents: a pool of 32; the paper's minibatch is 4 x 4 / 2 = 8
    cfg = SimConfig(agents=("tiny-llama", "tiny-gpt2"), mode="xhacpo", rounds=2, seed=0, prompts_per_round=4,
                    group_size=4, eval_every=0, eval_problems=10, state_dir=str(tmp_path / "coord"),
                    minibatch_size=minibatch)
    rows = run_sim(cfg, tmp_path / "metrics.jsonl", progress=False)
    trained = [r for r in rows if "train/num_updates" in r]
    assert {r["agent"] for r in trained} == {"tiny-llama", "tiny-gpt2"}
    assert all(r["train/num_samples"] + r["train/skipped_views"] == 32 for r in trained)
    assert {r["train/num_updates"] for r in trained} == {float(updates)}
