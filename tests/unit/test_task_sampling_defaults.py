"""A task's own sampling (its response budget) reaches a coordinator whose `[sampling]` leaves it out."""

from __future__ import annotations

import pytest

from hacfed.tasks.arithmetic import WORDS_MAX_NEW_TOKENS
from hacfed.tasks.math_data import GSM8K_MAX_NEW_TOKENS
from hacfed.tasks.registry import task_sampling_defaults
from server.coordinator.config import CoordinatorConfig

_BASE = {"run_id": "t", "rounds": 1, "prompts_per_round": 1, "group_size": 2, "expected_participants": 1,
         "min_participants": 1, "round_deadline_s": 10.0, "state_dir": "state"}


@pytest.mark.parametrize(("spec", "expected"), [
    ({"kind": "gsm8k"}, {"max_new_tokens": GSM8K_MAX_NEW_TOKENS}),
    ({"kind": "gsm8k", "max_new_tokens": 200}, {"max_new_tokens": 200}),
    ({"kind": "jsonl", "max_new_tokens": 90}, {"max_new_tokens": 90}),
    ({"kind": "jsonl"}, {}),
    ({"kind": "arithmetic", "style": "words"}, {"max_new_tokens": WORDS_MAX_NEW_TOKENS}),
    ({"kind": "arithmetic"}, {}),
    ({"kind": "chain"}, {}),
    ("gsm8k", {}),
])
def test_task_sampling_defaults(spec: object, expected: dict) -> None:
    assert task_sampling_defaults(spec) == expected


def test_coordinator_takes_the_task_budget_unless_sampling_sets_it() -> None:
    gsm8k = CoordinatorConfig.from_mapping({**_BASE, "task": {"kind": "gsm8k"}})
    assert gsm8k.sampling.max_new_tokens == GSM8K_MAX_NEW_TOKENS and gsm8k.sampling.temperature == 1.0
    table = {**_BASE, "task": {"kind": "gsm8k"}, "sampling": {"max_new_tokens": 100, "temperature": 0.9}}
    assert CoordinatorConfig.from_mapping(table).sampling.max_new_tokens == 100
    plain = CoordinatorConfig.from_mapping({**_BASE, "task": {"kind": "arithmetic"}})
    assert plain.sampling.max_new_tokens == 16  # SamplingParams' own default, as before
    # The resolved budget is written out, so a resumed run reads the same plan settings.
    assert CoordinatorConfig.from_mapping(gsm8k.to_dict()) == gsm8k
