"""A lab's participant with the learner-side rules and a sampling temperature: the plan's temperature
reaches its update, its trust in each partner is learned, logged and checkpointed, and the form of
its answers is tracked (random-init tiny models)."""

from __future__ import annotations

import pytest

from hacfed.hacpo_config import HacpoConfig
from hacfed.messages import RoundUpdate, SamplingParams
from tests.unit.test_participant import TASK, make, plan


def tempered_plan(round_id: int, hacpo: HacpoConfig, temperature: float = 0.6):
    p = plan(round_id)
    return type(p)(**{**p.__dict__, "sampling": SamplingParams(max_new_tokens=6, temperature=temperature),
                      "hacpo": hacpo})


def test_a_lab_trains_at_its_plans_temperature_and_learns_trust(tmp_path):
    # a and b hold the same weights (one preset, one seed): at any temperature, a's ratio of b's text
    # is 1 when both sides are the same tempered policy and a re-tokenizes the text into b's tokens
    # (most of these random texts; a few re-tokenize otherwise). Scored untempered it would not be.
    hacpo = HacpoConfig(mode="xhacpo", cross_ratio_unit="byte", trust_rate=0.5)
    a, b = make("a", "tiny-llama", tmp_path, learning_rate=1e-12), make("b", "tiny-llama")  # a barely moves
    first = RoundUpdate("run", None, (), {"a": 1.0, "b": 1.0}, tempered_plan(0, hacpo), ("a", "b"))
    sa, sb = a.step(first), b.step(first)
    assert 0 <= sa.report.metrics["answer_form_start_share"] <= 1 and a.answer_forms.start is not None
    # a failed everything; b is right on every other sample: b rescues every prompt (useful = short)
    pool = tuple(type(t)(**{**t.__dict__, "reward": 0.0}) for t in sa.trajectories) + tuple(
        type(t)(**{**t.__dict__, "reward": float(i % 2)}) for i, t in enumerate(sb.trajectories))
    out = a.step(RoundUpdate("run", 0, pool, {"a": 0.5, "b": 0.5}, tempered_plan(1, hacpo), ("a", "b"), hacpo))
    m = out.report.metrics
    assert m["cross/b/ratio_p50"] == pytest.approx(1.0, abs=1e-4)
    assert m["partner/b/short_prompts"] == 4 and m["partner/b/useful_prompts"] == 4
    assert m["trust/b"] == 1.0 and m["partner/kept_frac"] == 1.0
    # a useless b (never right): its trust falls by e^-.5 per update, and survives a restart
    useless = tuple(type(t)(**{**t.__dict__, "reward": 0.0}) for t in pool)
    a.step(RoundUpdate("run", 1, useless, {"a": 0.5, "b": 0.5}, tempered_plan(2, hacpo), ("a", "b"), hacpo))
    assert a.trust.weights()["b"] == pytest.approx(0.606531, abs=1e-6)
    resumed = make("a", "tiny-llama", tmp_path, learning_rate=1e-12)
    assert resumed.trust.weights() == a.trust.weights()
    assert resumed.learner_local() == {"temperature": 0.6, "trust": a.trust.weights(), "guided": ()}
    assert resumed.answer_forms.start == a.answer_forms.start


def test_a_lab_samples_guided_continuations_where_it_failed_and_trains_them(tmp_path):
    # a failed every prompt; b answered each prompt right once (its text replaced by the answer): a
    # samples 3 hinted continuations per prompt at its plan's settings and trains them as its own
    hacpo = HacpoConfig(mode="xhacpo", guide_samples=3, partner_use="context")
    a, b = make("a", "tiny-llama", tmp_path), make("b", "tiny-llama")
    first = RoundUpdate("run", None, (), {"a": 1.0, "b": 1.0}, tempered_plan(0, hacpo), ("a", "b"))
    sa, sb = a.step(first), b.step(first)
    answers = {p.prompt_id: TASK.problem(p.prompt_id).answer for p in tempered_plan(0, hacpo).prompts}
    pool = tuple(type(t)(**{**t.__dict__, "reward": 0.0}) for t in sa.trajectories) + tuple(
        type(t)(**{**t.__dict__, "response_text": answers[t.prompt_id], "reward": 1.0}) if i % 4 == 0
        else type(t)(**{**t.__dict__, "reward": 0.0}) for i, t in enumerate(sb.trajectories))
    out = a.step(RoundUpdate("run", 0, pool, {"a": 0.5, "b": 0.5}, tempered_plan(1, hacpo), ("a", "b"), hacpo))
    m = out.report.metrics
    assert m["guide/short_prompts"] == 4 and m["guide/prompts"] == 4 and m["guide/samples"] == 12
    assert m["num_samples"] == 16 + 12 and m["num_cross"] == 0  # own 4 x G 4, the guided; b's only as hints
    assert m["partner/in_context_frac"] == 4 / 16 and m["partner/grad_frac"] == 0.0
    assert 0 <= m["guide/success_frac"] <= 1
