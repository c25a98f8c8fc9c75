"""`hacfed sim --agents smollm2,tiny-qwen2 --task gsm8k --rounds 1` with its defaults: it runs end to
end (the tiny agent's 512-position context cuts its long prompts instead of stopping the run), every
round row says what fraction of each agent's responses was cut, a fraction above 10 % is warned about
once, naming --max-new-tokens, and the final rows carry the last update's skipped-sample counts.

The task's defaults (a one-sentence answer, 256 tokens, temperature 1: hacfed.tasks.math_data) keep
SmolLM2-135M's truncated fraction at most 0.2, the issue's bar (1 of 8 cut in this seeded run; 6 % of
48 validation answers in bench/gsm8k_budget.py), where asking for a worked solution cut 5 of 8 at 320.

In the long tier (`./scripts/test.sh --long`): it checks what a real model does with the task's
defaults, about 100 s of CPU-bound generation, the largest single cost of the default run. Its parts
are checked there: the truncated fraction and its warning (unit/test_gsm8k_task.py,
unit/test_participant.py), a prompt that fills a tiny model's context (unit/test_participant.py), and
SmolLM2 in a federation (integration/test_smollm2_cotrain.py)."""

from __future__ import annotations

import json

import pytest

from tests.smollm2 import NEEDS_SMOLLM2

pytestmark = [pytest.mark.slow, pytest.mark.long]


@NEEDS_SMOLLM2
def test_smollm2_and_a_tiny_agent_run_one_gsm8k_round_with_the_defaults(tmp_path, capsys, monkeypatch):
    import datasets
    import torch

    from hacfed.tools.cli import main

    # hacfed sim reads GSM8K through `datasets`, whose cache would otherwise be the user's.
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))

    torch.set_num_threads(1)
    out = tmp_path / "metrics.jsonl"
    code = main(["sim", "--agents", "smollm2,tiny-qwen2", "--task", "gsm8k", "--rounds", "1", "--quiet",
                 "--metrics-out", str(out), "--state-dir", str(tmp_path / "state")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    rounds = [r for r in rows if not r.get("final")]
    assert {r["agent"] for r in rounds} == {"smollm2", "tiny-qwen2"}
    assert all(0.0 <= r["rollout_truncated_frac"] <= 1.0 for r in rounds)
    assert next(r for r in rounds if r["agent"] == "smollm2")["rollout_truncated_frac"] <= 0.2
    for r in rounds:
        warned = f"warning: {r['agent']}: " in captured.err
        assert warned == (r["rollout_truncated_frac"] > 0.1), (r, captured.err)
    assert captured.err.count("raise --max-new-tokens") == sum(r["rollout_truncated_frac"] > 0.1 for r in rounds)
    final = {r["agent"]: r for r in rows if r.get("final")}
    assert set(final) == {"smollm2", "tiny-qwen2"}
    assert final["smollm2"]["train/num_updates"] >= 1
    assert all("train/skipped_context" in r and "train/skipped_context_own" in r for r in final.values())
