"""Guided rollouts in a whole `hacfed sim` federation (docs/partner_rules.md): with the coordinator
holding the answer keys, each lab samples hinted continuations where it failed, scores them against
a partner's verified answer and trains them as its own samples; partners' samples carry no gradient."""

from __future__ import annotations

import pytest
import torch

from hacfed.tools.sim import SimConfig, run_sim

pytestmark = pytest.mark.slow
AGENTS = ("tiny-llama", "tiny-gpt2")


@pytest.mark.parametrize("mode", ["xhacpo-guided", "xhacpo-guided-hinted"])
def test_guided_samples_are_generated_and_trained(tmp_path, zoo_presets, mode):
    zoo_presets(*AGENTS)
    torch.set_num_threads(1)
    cfg = SimConfig(agents=AGENTS, mode=mode, rounds=3, seed=0, prompts_per_round=8, group_size=4, eval_every=0,
                    eval_problems=10, eval_start=False, answer_keys="coordinator", state_dir=str(tmp_path / "coord"))
    rows = run_sim(cfg, tmp_path / "metrics.jsonl", progress=False)
    trained = [r for r in rows if "train/guide/samples" in r]
    assert {r["agent"] for r in trained} == set(AGENTS)
    for r in trained:
        # the update trained the lab's own 8 x 4 samples and its guided ones, no partner sample
        assert r["train/num_samples"] == 8 * 4 + r["train/guide/samples"]
        assert r["train/num_cross"] == 0 and r["train/partner/grad_frac"] == 0.0
        assert r["train/guide/prompts"] <= r["train/guide/short_prompts"]
    for agent in AGENTS:
        mine = [r for r in trained if r["agent"] == agent]
        assert sum(r["train/guide/samples"] for r in mine) > 0
        assert sum(r["train/partner/in_context_frac"] for r in mine) > 0
