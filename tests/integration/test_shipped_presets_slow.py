"""The shipped demo presets are what their recipes build: each warmed up from scratch here (seed 0,
one torch thread, 20-90 s each on 2 idle cores) stops at the same step with the same held-out
accuracy and answers every validation problem as the shipped copy does. On the machine that built
them the bytes are equal too (`scripts/build_presets.py --check`).

tiny-llama (the fewest warm-up steps) is rebuilt in the default run; tiny-gpt2 and tiny-qwen2, whose
warm-ups take about three times as long, in the long tier (`./scripts/test.sh --long`). The default run
checks what is theirs alone: each shipped config and tokenizer is what the code builds and each
recipe hash the current one (tests/unit/test_shipped_presets.py); the warm-up loop they share is the
one rebuilt here.
"""

from __future__ import annotations

import json

import pytest
import torch

from hacfed.models import shipped
from hacfed.models.loading import load_model
from hacfed.models.zoo import get_preset, warm_up_preset
from hacfed.rollout.hf import generate

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _greedy_texts(model, tokenizer, problems) -> list[str]:
    groups = generate(model, tokenizer, [p.messages for p in problems], greedy=True, max_new_tokens=8, batch_size=128)
    return [g[0].text for g in groups]


DEFAULT_TIER = ("tiny-llama",)


@pytest.mark.parametrize("name", [name if name in DEFAULT_TIER else pytest.param(name, marks=pytest.mark.long)
                                  for name in shipped.SHIPPED_PRESETS])
def test_a_shipped_preset_is_what_its_recipe_builds(name):
    meta = json.loads((shipped.shipped_dir(name) / "hacfed_model.json").read_text())
    copy = load_model(str(shipped.shipped_dir(name)))
    model, tokenizer, result = warm_up_preset(name, 0, progress=False)
    assert (result.steps, result.accuracy) == (meta["warmup_steps"], meta["heldout_accuracy"])
    held_out = get_preset(name).warmup_task().validation_problems()
    assert _greedy_texts(copy.model, copy.tokenizer, held_out) == _greedy_texts(model, tokenizer, held_out)
