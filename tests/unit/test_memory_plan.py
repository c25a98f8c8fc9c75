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
