"""Samples whose loss has no gradient run no forward or backward (`hacfed.clients.no_grad_rows`).

A zero-advantage sample contributes exactly zero to the policy objective; without a KL term on it
its forward and backward are wasted. Skipping them must leave the parameters after an update what
the full update gives (to float rounding), keep the loss's normaliser and the whole minibatch's
metrics, and report the skipped samples. A pool whose every group has equal rewards runs no
forward at all."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch

from hacfed.clients.participant import Participant, ParticipantConfig
from hacfed.clients.training import with_local_ids
from hacfed.clients.update import default_minibatch, hacpo_update
from hacfed.hacpo_config import HacpoConfig
from hacfed.messages import PlannedPrompt, RoundPlan, RoundUpdate, SamplingParams
from hacfed.models.zoo import build_untrained
from hacfed.tasks.arithmetic import ArithmeticTask

TASK = ArithmeticTask(digits=2, num_train=200, num_eval=20)
# Only computed for the rows trained on (a skipped row's ratio is never computed).
RATIO_STATS = ("self_ratio_mean", "cross_ratio_mean", "self_clip_frac", "cross_clip_frac")


def make(pid: str, preset: str, **kw) -> Participant:
    model, tok = build_untrained(preset, seed=1)
    return Participant(ParticipantConfig(pid, preset, eval_problems=8, microbatch_tokens=None, **kw), model, tok, TASK)


def rollouts(mode: str):
    """Both agents' rollouts of 4 prompts x G 4, and the learner a."""
    problems = TASK.train_problems()[:4]
    plan = RoundPlan(run_id="run", round_id=0, prompts=tuple(PlannedPrompt(p.prompt_id, p.messages) for p in problems),
                     group_size=4, sampling=SamplingParams(max_new_tokens=6), hacpo=HacpoConfig(mode=mode))
    a, b = make("a", "tiny-llama"), make("b", "tiny-gpt2")
    first = RoundUpdate("run", None, (), {"a": 1.0, "b": 1.0}, plan, ("a", "b"))
    return a, a.step(first).trajectories + b.step(first).trajectories


def with_rewards(pool, varied: set[str]):
    """Rewards equal within every prompt but those of `varied`, where they alternate."""
    order = sorted({t.prompt_id for t in pool})
    return [type(t)(**{**t.__dict__, "reward": float(i % 2 == 0) if t.prompt_id in varied
                       else float(order.index(t.prompt_id) % 2)}) for i, t in enumerate(pool)]


def sgd(p: Participant) -> torch.optim.Optimizer:
    """Momentum SGD: a step with zero gradients still moves (unlike no step), and unlike Adam it
    does not blow the float rounding of near-zero gradients up to the step size."""
    return torch.optim.SGD([x for x in p.model.parameters() if x.requires_grad], lr=0.5, momentum=0.9)


def update(p: Participant, pool, cfg: HacpoConfig, minibatch: int | None, tokens: int | None, skip: bool,
           optimizer: torch.optim.Optimizer | None = None):
    pool = [with_local_ids(t, p.own_samples, "a") for t in pool]
    return hacpo_update(p.model, p.tokenizer, optimizer or p.optimizer, p.reference, pool, "a", ("a", "b"),
                        {"a": 0.5, "b": 0.25}, cfg, minibatch_size=minibatch or default_minibatch(pool),
                        max_grad_norm=1.0, max_prompt_len=64, max_response_len=16,
                        microbatch_tokens=tokens, skip_no_grad=skip)


def params(p: Participant) -> torch.Tensor:
    return torch.cat([x.detach().flatten() for x in p.model.parameters() if x.requires_grad])


def count_forwards(p: Participant) -> list[int]:
    seen: list[int] = []
    p.model.register_forward_pre_hook(lambda module, args: seen.append(1))
    return seen


@pytest.mark.parametrize("mode, kl_coef, minibatch, tokens", [
    ("gspo", 0.0, None, None),  # own samples only: the first minibatch's groups are all equal
    ("hacpo", 0.0, 5, None),  # minibatches that mix skipped and trained rows, own and cross
    ("hacpo", 0.001, None, None),  # the KL keeps every own sample; equal-reward cross samples skip
    ("xhacpo", 0.0, 6, 64),  # per-byte cross ratios; the trained rows in microbatches
    ("grpo", 0.0, 5, None),  # token-level loss: its normaliser is the minibatch's tokens
])
def test_skipping_samples_without_gradient_trains_the_same(mode, kl_coef, minibatch, tokens):
    learner, pool = rollouts(mode)
    pool = with_rewards(pool, varied={sorted({t.prompt_id for t in pool})[2]})
    cfg = HacpoConfig(mode=mode, kl_coef=kl_coef)
    full = copy.deepcopy(learner)
    lean_fwd, full_fwd = count_forwards(learner), count_forwards(full)
    lean_opt, full_opt = sgd(learner), sgd(full)
    before = params(learner).clone()
    for _ in range(2):
        lean = update(learner, pool, cfg, minibatch, tokens, skip=True, optimizer=lean_opt)
        whole = update(full, pool, cfg, minibatch, tokens, skip=False, optimizer=full_opt)
        assert lean["skipped_no_grad"] > 0 and whole["skipped_no_grad"] == 0
        assert lean["skipped_no_grad_frac"] == lean["skipped_no_grad"] / lean["num_samples"]
        assert set(whole) - set(lean) <= {k for k in whole if k.endswith(("ratio_mean", "clip_frac"))}
        for key in set(whole) & set(lean):
            if key.startswith("skipped_no_grad") or key in RATIO_STATS or "/ratio_p" in key:
                continue
            assert math.isclose(whole[key], lean[key], rel_tol=1e-5, abs_tol=1e-6), (key, whole[key], lean[key])
    p1, p2 = params(learner), params(full)
    assert float((p2 - before).abs().max()) > 1e-3  # the update moved the parameters
    assert torch.allclose(p1, p2, rtol=0, atol=1e-6), float((p1 - p2).abs().max())
    assert len(lean_fwd) < len(full_fwd)


@pytest.mark.parametrize("mode", ["gspo", "hacpo", "xhacpo"])
def test_a_pool_of_equal_groups_runs_no_forward(mode):
    learner, pool = rollouts(mode)
    pool = with_rewards(pool, varied=set())
    cfg = HacpoConfig(mode=mode, kl_coef=0.0)
    full = copy.deepcopy(learner)
    forwards = count_forwards(learner)
    out = update(learner, pool, cfg, None, None, skip=True)
    whole = update(full, pool, cfg, None, None, skip=False)
    assert forwards == []
    assert out["skipped_no_grad"] == out["num_samples"] > 0 and out["skipped_no_grad_frac"] == 1.0
    assert out["num_updates"] == whole["num_updates"] and out["loss"] == pytest.approx(whole["loss"], abs=1e-9)
    assert torch.equal(params(learner), params(full))


def test_the_kl_term_keeps_own_samples():
    learner, pool = rollouts("hacpo")
    pool = with_rewards(pool, varied=set())
    out = update(learner, pool, dataclasses.replace(HacpoConfig(mode="hacpo"), kl_coef=0.01), None, None, skip=True)
    own = sum(1 for t in pool if t.source_id == "a")
    assert out["skipped_no_grad"] == out["num_samples"] - own and "kl" in out


def eos_only(t):
    """`t` as an empty answer that stopped at once (no tokens, so no source summary)."""
    ids = () if t.response_token_ids is not None else None
    return dataclasses.replace(t, response_text="", source_logp_sum=0.0, source_token_count=0,
                               finish_reason="stop", response_token_ids=ids)


@pytest.mark.parametrize("mode", ["gspo", "hacpo", "xhacpo", "sapo", "grpo"])
def test_a_skipped_eos_only_sample_needs_no_old_side(mode):
    # An EOS-only sample has no source summary: its old side is the learner's own log-prob, which
    # is only scored for rows that train. Skipped, it must not need one.
    learner, pool = rollouts(mode)
    pool = with_rewards(pool, varied={sorted({t.prompt_id for t in pool})[2]})
    equal = sorted({t.prompt_id for t in pool})[0]
    pool = [eos_only(t) if t.prompt_id == equal and t.trajectory_id.endswith(("/0", "/1")) else t for t in pool]
    assert sum(t.source_token_count == 0 for t in pool) >= 2
    full = copy.deepcopy(learner)
    cfg = HacpoConfig(mode=mode, kl_coef=0.0)
    lean = update(learner, pool, cfg, 5, None, skip=True, optimizer=sgd(learner))
    whole = update(full, pool, cfg, 5, None, skip=False, optimizer=sgd(full))
    assert lean["skipped_no_grad"] > 0
    assert lean["loss"] == pytest.approx(whole["loss"], abs=1e-6)
    assert torch.allclose(params(learner), params(full), rtol=0, atol=1e-6)


def test_a_labs_round_skips_and_reports_it():
    # On by default: a lab's update on a pool of equal groups (the EOS-only samples among them)
    # runs no forward, and its metrics say how many samples it skipped.
    learner, pool = rollouts("hacpo")
    pool = [eos_only(t) if t.trajectory_id.endswith("/0") else t for t in with_rewards(pool, varied=set())]
    forwards = count_forwards(learner)
    cfg = HacpoConfig(mode="hacpo", kl_coef=0.0)
    out = learner.train_on_pool(RoundUpdate("run", 0, tuple(pool), {"a": 0.5, "b": 0.25}, None, ("a", "b"), cfg))
    assert forwards == []
    assert out["skipped_no_grad"] == out["num_samples"] > 0 and out["skipped_no_grad_frac"] == 1.0
