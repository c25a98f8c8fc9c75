"""Participant round: rollout, update on a mixed pool, checkpoint round trip (random-init tiny models)."""

from __future__ import annotations

import math
import re

import pytest
import torch

from hacfed.clients.participant import Participant, ParticipantConfig
from hacfed.clients.sequence_ratio import mean_logp_over_ratio_tokens
from hacfed.clients.update import order_pool
from hacfed.hacpo_config import HacpoConfig
from hacfed.messages import PlannedPrompt, RoundPlan, RoundUpdate, SamplingParams
from hacfed.models.zoo import build_untrained
from hacfed.tasks.arithmetic import ArithmeticTask
from hacfed.trajectory import ChatMessage

TASK = ArithmeticTask(digits=2, num_train=200, num_eval=20)


def plan(round_id: int, n: int = 4, g: int = 4, mode: str = "hacpo", evaluate: bool = False) -> RoundPlan:
    problems = TASK.train_problems()[round_id * n : (round_id + 1) * n]
    return RoundPlan(
        run_id="run", round_id=round_id, prompts=tuple(PlannedPrompt(p.prompt_id, p.messages) for p in problems),
        group_size=g, sampling=SamplingParams(max_new_tokens=6), hacpo=HacpoConfig(mode=mode), evaluate=evaluate,
    )


def make(pid: str, preset: str, tmp_path=None, **kw) -> Participant:
    model, tok = build_untrained(preset, seed=1)
    # The pools here carry made-up rewards (a random model's text marked right), which the inbound text
    # filter would leave out as successes without the task's answer form (tests/unit/test_textfilter*.py).
    kw.setdefault("inbound_filter", False)
    cfg = ParticipantConfig(pid, preset, eval_problems=8, checkpoint_dir=str(tmp_path) if tmp_path else None, **kw)
    return Participant(cfg, model, tok, TASK)


def params(p: Participant) -> torch.Tensor:
    return torch.cat([x.detach().flatten() for x in p.model.parameters() if x.requires_grad])


@pytest.fixture(scope="module")
def two_rollouts():
    a, b = make("a", "tiny-llama"), make("b", "tiny-gpt2")
    first = RoundUpdate("run", None, (), {"a": 1.0, "b": 1.0}, plan(0), ("a", "b"))
    sa, sb = a.step(first), b.step(first)
    return a, b, sa, sb


def test_rollout_submission_is_complete_and_tokenizer_neutral(two_rollouts):
    a, _, sa, _ = two_rollouts
    assert sa.round_id == 0 and sa.participant_id == "a"
    assert len(sa.trajectories) == 4 * 4
    counts = {}
    for t in sa.trajectories:
        counts[t.prompt_id] = counts.get(t.prompt_id, 0) + 1
        assert t.response_token_ids is None  # local ids never leave the lab
        assert t.source_logp_sum <= 0 and math.isfinite(t.source_logp_sum)
        assert t.reward == TASK.verify(TASK.problem(t.prompt_id), t.response_text).reward
    assert set(counts.values()) == {4}
    assert "reward_mean" in sa.report.metrics


def test_update_on_mixed_pool_changes_parameters_and_reports(two_rollouts):
    a, _, sa, sb = two_rollouts
    # Force reward variance so advantages are non-zero whatever the random model produced.
    pool = []
    for i, t in enumerate(sa.trajectories + sb.trajectories):
        pool.append(type(t)(**{**t.__dict__, "reward": float(i % 2)}))
    before = params(a).clone()
    update = RoundUpdate("run", 0, tuple(pool), {"a": 0.5, "b": 0.25}, plan(1), ("a", "b"))
    sub = a.step(update)
    m = sub.report.metrics
    assert not torch.equal(before, params(a))
    assert math.isfinite(m["loss"]) and m["num_samples"] == 32
    assert m["num_updates"] == 4  # own 16 + other 16 samples, minibatch = 4 prompts × G 4 / 2 = 8
    assert 0 < m["num_cross"] and "kl" in m and m["kl"] >= 0
    assert a.policy_version == 1
    assert {t.policy_version for t in sub.trajectories} == {1}


def test_own_samples_first_then_agent_order(two_rollouts):
    _, _, sa, sb = two_rollouts
    pool = list(sb.trajectories[:2]) + list(sa.trajectories[:2])
    ordered = order_pool(pool, "a", ["b", "a"], HacpoConfig())
    assert [t.source_id for t in ordered] == ["a", "a", "b", "b"]
    assert [t.source_id for t in order_pool(pool, "a", ["a", "b"], HacpoConfig(mode="gspo"))] == ["a", "a"]


def test_own_sample_ratio_starts_at_one():
    # The log-prob summary of our own rollout equals the teacher-forced recomputation.
    from hacfed.clients.update import build_views
    from hacfed.rollout.logprobs import sequence_logprobs

    p = make("a", "tiny-qwen2")
    sub = p.step(RoundUpdate("run", None, (), {"a": 1.0}, plan(0, n=2, g=3), ("a",)))
    own = [p.own_samples[t.trajectory_id] for t in sub.trajectories if t.source_token_count > 0]
    views, skipped = build_views(own, "a", p.tokenizer, max_prompt_len=128, max_response_len=64)
    assert skipped == 0
    logp, _ = sequence_logprobs(
        p.model, [v.prompt_ids for v in views], [v.response_ids for v in views], p.tokenizer.pad_token_id
    )
    learner = mean_logp_over_ratio_tokens(logp, views)
    source = torch.tensor([v.source_mean_logp for v in views])
    assert torch.allclose(learner.double(), source.double(), atol=1e-4)


def test_checkpoint_round_trip_resumes_exactly(tmp_path):
    a = make("a", "tiny-llama", tmp_path)
    sub0 = a.step(RoundUpdate("run", None, (), {"a": 1.0}, plan(0), ("a",)))
    pool = tuple(type(t)(**{**t.__dict__, "reward": float(i % 2)}) for i, t in enumerate(sub0.trajectories))
    nxt = RoundUpdate("run", 0, pool, {"a": 0.5}, plan(1), ("a",))
    resumed = make("a", "tiny-llama", tmp_path)  # restart from the checkpoint written after round 0
    assert resumed.last_round == 0 and resumed.policy_version == 0
    assert torch.equal(params(resumed), params(a))
    out_a, out_r = a.step(nxt), resumed.step(nxt)
    assert torch.allclose(params(a), params(resumed), atol=1e-6)
    assert [t.response_text for t in out_a.trajectories] == [t.response_text for t in out_r.trajectories]
    # both wrote a checkpoint of round 1 into the same dir: the second one never replaces the first
    assert (tmp_path / "LATEST").read_text().strip() == "ckpt-000001-2"


def test_lora_trains_adapter_only():
    p = make("a", "tiny-llama", finetune="lora", learning_rate=1e-2)
    base = {n: x.detach().clone() for n, x in p.model.named_parameters() if not x.requires_grad}
    sub = p.step(RoundUpdate("run", None, (), {"a": 1.0}, plan(0), ("a",)))
    pool = tuple(type(t)(**{**t.__dict__, "reward": float(i % 2)}) for i, t in enumerate(sub.trajectories))
    before = params(p).clone()
    p.step(RoundUpdate("run", 0, pool, {"a": 0.5}, plan(1), ("a",)))
    assert not torch.equal(before, params(p))
    for n, x in p.model.named_parameters():
        if not x.requires_grad:
            assert torch.equal(x, base[n])


@pytest.mark.parametrize("name, value", [
    ("participant_id", ""), ("model", None), ("finetune", "qlora"), ("lora_rank", 0), ("lora_alpha", True),
    ("learning_rate", -1.0), ("learning_rate", float("inf")), ("learning_rate", "5e-5"), ("minibatch_size", 0),
    ("max_grad_norm", 0.0), ("max_grad_norm", float("nan")), ("max_prompt_len", 0), ("max_response_len", 1.5),
    ("eval_problems", 0), ("eval_split", "train"), ("eval_sampled", 1), ("rollout_batch_size", 0), ("device", ""),
    ("seed", -1), ("seed", True), ("checkpoint_dir", ""), ("keep_checkpoints", 1), ("rollout_backend", "tgi"),
    ("nproc", 0), ("nproc", 65), ("nproc", True),
])
def test_config_validation_names_the_field_and_value(name: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"^ParticipantConfig\.{name} must be .*, got {re.escape(repr(value))}$"):
        ParticipantConfig(**{"participant_id": "a", "model": "tiny-llama", name: value})


@pytest.mark.parametrize("limits, long_chars, skipped", [
    ({"max_response_len": 64}, 200, {"skipped_views": 1, "skipped_context": 0}),  # over the set limit
    # unset limits: prompt + response past the 512-position context
    ({}, 500, {"skipped_views": 0, "skipped_context": 1}),
])
def test_mixed_minibatches_with_kl_and_oversized_cross_samples(two_rollouts, limits, long_chars, skipped):
    # minibatch 3 mixes own and other samples of different lengths; the KL must still line up.
    _, _, sa, sb = two_rollouts
    long_other = type(sb.trajectories[0])(**{**sb.trajectories[0].__dict__, "trajectory_id": "long",
                                             "response_text": "9" * long_chars, "source_token_count": 6})
    both = sa.trajectories[:4] + sb.trajectories[:4]
    pool = [type(t)(**{**t.__dict__, "reward": float(i % 2)}) for i, t in enumerate(both)]
    p = make("a", "tiny-llama", minibatch_size=3, **limits)
    p.step(RoundUpdate("run", None, (), {"a": 1.0, "b": 1.0}, plan(0), ("a", "b")))  # so "a" has own ids
    own = [type(t)(**{**t.__dict__, "reward": float(i % 2)}) for i, t in enumerate(p.own_samples.values())][:4]
    sub = p.step(RoundUpdate("run", 0, tuple(own + pool[4:] + [long_other]), {"a": 0.5, "b": 0.5}, plan(1), ("a", "b")))
    m = sub.report.metrics
    assert m["num_updates"] == 3 and m["num_samples"] == 8  # 4 own + 4 other; the long one skipped
    assert {k: m[k] for k in skipped} == skipped and m["skipped_context_own"] == 0 and math.isfinite(m["kl"])


def test_a_prompt_that_fills_the_context_gets_cut_answers_that_are_not_trained_on():
    """A small model answers a plan whose prompt is longer than its context (from the prompt's end,
    within an eighth of the context) and leaves those samples out of its own update."""
    p = make("a", "tiny-llama")
    long_prompt = (ChatMessage("user", "7" * 600),)
    problems = TASK.train_problems()[:2]
    prompts = (PlannedPrompt(problems[0].prompt_id, problems[0].messages),
               PlannedPrompt(problems[1].prompt_id, long_prompt))
    first = RoundPlan(run_id="run", round_id=0, prompts=prompts, group_size=2,
                      sampling=SamplingParams(max_new_tokens=6), hacpo=HacpoConfig())
    sub = p.step(RoundUpdate("run", None, (), {"a": 1.0}, first, ("a",)))
    cut = [t for t in sub.trajectories if t.prompt_id == problems[1].prompt_id]
    assert len(cut) == 2 and all(t.source_token_count <= 64 for t in cut)
    sub = p.step(RoundUpdate("run", 0, sub.trajectories, {"a": 1.0}, plan(1), ("a",)))
    assert sub.report.metrics["skipped_context_own"] == 2 and sub.report.metrics["num_samples"] == 2


def test_truncated_fraction_counts_length_finishes(two_rollouts):
    from hacfed.clients.participant import truncated_fraction

    _, _, sa, _ = two_rollouts
    reasons = ["length", "stop", "stop", "stop"]
    ts = [type(t)(**{**t.__dict__, "finish_reason": reason}) for t, reason in zip(sa.trajectories, reasons)]
    assert truncated_fraction(ts) == 0.25 and truncated_fraction([]) == 0.0


def test_evaluation_scores_each_half_of_a_mix_and_reports_it():
    from hacfed.clients.rollout_and_eval import evaluate_held_out, scores_by_half
    from hacfed.tasks.chain import ChainTask

    mix = ChainTask(notations=("sym", "word"), num_train=40, num_validation=8, num_eval=8)
    problems = list(mix.eval_problems())  # sym add, sym sub, word add, word sub, ...
    assert scores_by_half(mix, problems, [1, 1, 0, 0, 1, 0, 0, 0]) == {"sym": 0.75, "word": 0.0}
    assert scores_by_half(ChainTask(num_train=40, num_validation=8, num_eval=8), problems[:4], [1, 0, 1, 1]) == {
        "add": 1.0, "sub": 0.5}
    # No halves: a task without half_of, a one-half task, or problems all from one half.
    assert scores_by_half(TASK, TASK.eval_problems()[:2], [1, 0]) == {}
    task = ChainTask(operations=("add",), num_train=40, num_validation=8, num_eval=8)
    assert scores_by_half(task, problems[:1], [1]) == {}
    assert scores_by_half(mix, problems[:2], [1, 0]) == {}
    # The halves' scores are means over the same greedy completions as the whole score.
    model, tok = build_untrained("tiny-llama", seed=1)
    scores = evaluate_held_out(model, tok, mix, 8, 8)
    assert set(scores.greedy_by_half) == {"sym", "word"}
    assert math.isclose(sum(scores.greedy_by_half.values()) / 2, scores.greedy)
    # ... and a participant reports them beside its greedy accuracy.
    cfg = ParticipantConfig("a", "tiny-llama", eval_problems=8)
    p = Participant(cfg, model, tok, mix)
    first = mix.train_problems()[0]
    asks = RoundPlan(run_id="run", round_id=0, prompts=(PlannedPrompt(first.prompt_id, first.messages),), group_size=2,
                     sampling=SamplingParams(max_new_tokens=8), hacpo=HacpoConfig(), evaluate=True)
    report = p.step(RoundUpdate("run", None, (), {"a": 1.0}, asks, ("a",))).report
    assert report.eval_accuracy is not None
    assert {k for k in report.metrics if k.startswith("eval_greedy/")} == {"eval_greedy/sym", "eval_greedy/word"}
