"""The vLLM engine against the transformers one, on a real GPU (skipped elsewhere).

Run on a CUDA machine with `pip install 'hacfed[vllm]'`:
    pytest tests/integration/test_vllm.py -m "vllm and gpu"
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from hacfed.models.zoo import build_untrained
from hacfed.rollout import sequence_logprobs
from hacfed.rollout.vllm_backend import VllmRollout
from hacfed.trajectory import ChatMessage, render_prompt_ids

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM (pip install 'hacfed[vllm]')"),
]

PROMPTS = [
    [ChatMessage("user", "7+8=")],
    [ChatMessage("system", "Answer with a number."), ChatMessage("user", "What is 12+30?")],
]


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    model, tok = build_untrained("tiny-qwen2", seed=0)
    folder = tmp_path_factory.mktemp("tiny-qwen2")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder, model, tok


@pytest.fixture(scope="module")
def engine(saved_model):
    folder, _, _ = saved_model
    return VllmRollout(str(folder), dtype="float32", gpu_memory_utilization=0.2, enforce_eager=True)


def test_vllm_logprobs_match_transformers_scoring(saved_model, engine):
    _, model, tok = saved_model
    groups = engine.generate(None, tok, PROMPTS, num_samples=4, max_new_tokens=12, seed=0)
    assert [len(g) for g in groups] == [4, 4]
    flat = [c for g in groups for c in g]
    assert all(tok.eos_token_id not in c.token_ids for c in flat)
    assert all(c.finish_reason == "stop" or len(c.token_ids) == 12 for c in flat)
    model = model.to("cuda")
    prompt_ids = [render_prompt_ids(tok, p) for p in PROMPTS for _ in range(4)]
    with torch.inference_mode():
        logp, mask = sequence_logprobs(model, prompt_ids, [c.token_ids for c in flat], tok.pad_token_id)
    for row, c in enumerate(flat):
        # Different GPU kernels: agreement to ~1e-3 per sequence in float32.
        assert logp[row].sum().item() == pytest.approx(c.logprob_sum, abs=1e-2)


def test_vllm_seeded_sampling_is_reproducible(saved_model, engine):
    _, _, tok = saved_model
    a = engine.generate(None, tok, PROMPTS, num_samples=3, max_new_tokens=8, seed=3)
    b = engine.generate(None, tok, PROMPTS, num_samples=3, max_new_tokens=8, seed=3)
    assert [[c.token_ids for c in g] for g in a] == [[c.token_ids for c in g] for g in b]
