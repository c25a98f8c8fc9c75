"""Loading-side memory choices: LoRA and activation checkpointing above the size thresholds, bf16 only where it pays."""

from __future__ import annotations

import pytest

from hacfed.models.memory import CHECKPOINT_ABOVE, LORA_ABOVE, apply_memory_plan, memory_plan


def test_small_models_are_fully_fine_tuned_in_float32():
    plan = memory_plan(135_000_000, "cpu")
    assert (plan.finetune, plan.gradient_checkpointing, plan.dtype) == ("full", False, "float32")
    assert plan.state_bytes == 135_000_000 * 20


def test_large_models_get_lora_checkpointing_and_bf16_on_a_bf16_device():
    plan = memory_plan(1_500_000_000, "cuda:0", bf16=True)
    assert (plan.finetune, plan.gradient_checkpointing, plan.dtype) == ("lora", True, "bfloat16")
    assert memory_plan(1_500_000_000, "cpu", bf16=True).dtype == "float32"
    assert memory_plan(LORA_ABOVE + 1, "cpu").finetune == "lora" and memory_plan(LORA_ABOVE, "cpu").finetune == "full"
    assert memory_plan(CHECKPOINT_ABOVE + 1, "cpu").gradient_checkpointing


def test_an_explicit_choice_wins_and_full_fine_tuning_keeps_float32():
    plan = memory_plan(1_500_000_000, "cuda", bf16=True, finetune="full")
    assert (plan.finetune, plan.dtype) == ("full", "float32")
    assert memory_plan(1_000, "cpu", finetune="lora").finetune == "lora"


@pytest.mark.parametrize("kwargs, match", [
    ({"parameters": 0}, "parameters"), ({"parameters": 10, "finetune": "qlora"}, "finetune"),
])
def test_bad_input_is_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        memory_plan(**kwargs)


def test_checkpointing_is_switched_on_in_the_model():
    from hacfed.models.zoo import build_untrained

    model, _ = build_untrained("tiny-qwen2", seed=0)
    apply_memory_plan(model, memory_plan(CHECKPOINT_ABOVE + 1, "cpu", finetune="full"))
    assert model.is_activation_checkpointing


def test_microbatch_cap_bounds_a_real_models_activations_and_spares_tiny_ones(monkeypatch):
    from types import SimpleNamespace

    from hacfed.clients.participant import Participant, ParticipantConfig
    from hacfed.models.memory import activation_bytes_per_token, microbatch_token_cap
    from hacfed.models.zoo import build_untrained
    from hacfed.tasks.registry import load_task

    smollm2 = SimpleNamespace(num_hidden_layers=30, hidden_size=576, intermediate_size=1536, vocab_size=49152)
    # 4 x (30 x (14 x 576 + 6 x 1536) + 4 x 49152) = 4 x (518,400 + 196,608) = 2,860,032 bytes a token
    assert activation_bytes_per_token(smollm2) == 2_860_032
    assert microbatch_token_cap(smollm2, 4096) == 512 * 2**20 // 2_860_032 == 187
    assert microbatch_token_cap(smollm2, 100) == 100  # a smaller budget is kept
    assert microbatch_token_cap(smollm2, None) is None  # never split
    model, tok = build_untrained("tiny-gpt2", seed=0)  # n_inner unset: 4 x hidden
    assert microbatch_token_cap(model.config, 4096) == 4096
    task = load_task({"kind": "arithmetic", "digits": 2, "operators": "+"})
    lab = Participant(ParticipantConfig("a", "tiny-gpt2", eval_problems=8), model, tok, task)
    assert lab.cfg.microbatch_tokens == 4096
    # A lab applies the cap: with room for 100 tokens of tiny-gpt2's 81,952 bytes each
    # (4 x (4 x (14 x 128 + 6 x 512) + 4 x 258)), its microbatches hold 100 tokens.
    monkeypatch.setattr("hacfed.models.memory.ACTIVATION_BYTES", 100 * 81_952)
    lab = Participant(ParticipantConfig("a", "tiny-gpt2", eval_problems=8), model, tok, task)
    assert lab.cfg.microbatch_tokens == 100
