"""A short in-process federation really learns: two heterogeneous agents, HACPO, fixed seed.

The presets are built (side by side) and cached under HACFED_HOME before the run starts.
"""

from __future__ import annotations

import json

import pytest
import torch

from hacfed.tools.sim import SimConfig, run_sim, summary_table

pytestmark = pytest.mark.slow


def _mean(values):
    return sum(values) / len(values)


def test_hacpo_federation_reward_rises(tmp_path, zoo_presets):
    zoo_presets("tiny-llama", "tiny-gpt2")
    torch.set_num_threads(1)  # deterministic and faster on small machines
    cfg = SimConfig(
        agents=("tiny-llama", "tiny-gpt2"), mode="hacpo", rounds=40, seed=0, prompts_per_round=16, group_size=8,
        eval_every=20, eval_problems=100, learning_rate=5e-5, state_dir=str(tmp_path / "coord"),
    )
    metrics = tmp_path / "metrics.jsonl"
    rows = run_sim(cfg, metrics, progress=False)
    print(summary_table(rows))
    # the metrics file holds what the function returned, one JSON object per line
    assert [json.loads(line) for line in metrics.read_text().splitlines()] == rows
    for agent in ("tiny-llama", "tiny-gpt2"):
        mine = sorted((r for r in rows if r["agent"] == agent and not r.get("final")), key=lambda r: r["round"])
        assert [r["round"] for r in mine] == list(range(40))
        assert all(r["accepted"] + r["rejected"] == 16 * 8 for r in mine)
        # honest labs: rejections are rare (a group goes only when a sample is malformed, e.g. a
        # response of special tokens that decodes to empty text)
        assert sum(r["rejected"] for r in mine) <= 0.05 * 16 * 8 * 40
        # both agents trained on the other's re-tokenized samples
        assert all(r["train/num_cross"] > 0 for r in mine[1:])
    rewards = {a: [r["reward_mean"] for r in sorted(rows, key=lambda r: r["round"])
                   if r["agent"] == a and not r.get("final")] for a in ("tiny-llama", "tiny-gpt2")}
    start = _mean([_mean(v[:8]) for v in rewards.values()])
    end = _mean([_mean(v[-8:]) for v in rewards.values()])
    assert end > start + 0.01, f"sampled reward did not rise: first 8 rounds {start:.3f}, last 8 rounds {end:.3f}"
    finals = [r for r in rows if r.get("final")]
    assert {r["agent"] for r in finals} == {"tiny-llama", "tiny-gpt2"}
