"""A minibatch split into microbatches by a token budget trains exactly like one pass.

`hacpo_update` with a small `microbatch_tokens` runs each minibatch's forward/backward in several
microbatches and accumulates their weighted gradients; the optimizer step, the parameters after it
and every metric must match the one-pass update of a twin participant to float rounding, and no
forward may hold more padded tokens than the budget (every row here fits it alone)."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch

from hacfed.clients.participant import Participant, ParticipantConfig
from hacfed.hacpo_config import HacpoConfig
from hacfed.messages import PlannedPrompt, RoundPlan, RoundUpdate, SamplingParams
from hacfed.models.zoo import build_untrained
from hacfed.tasks.arithmetic import ArithmeticTask

TASK = ArithmeticTask(digits=2, num_train=200, num_eval=20)
BUDGET = 64  # tokens: two or three of these rows (13-20 prompt + up to 7 response tokens) per microbatch


def make(pid: str, preset: str, **kw) -> Participant:
    model, tok = build_untrained(preset, seed=1)
    return Participant(ParticipantConfig(pid, preset, eval_problems=8, microbatch_tokens=None, **kw), model, tok, TASK)


def mixed_pool(mode: str, finetune: str):
    """Both agents' rollouts of 4 prompts x G 4, rewards forced to vary (non-zero advantages)."""
    problems = TASK.train_problems()[:4]
    plan = RoundPlan(run_id="run", round_id=0, prompts=tuple(PlannedPrompt(p.prompt_id, p.messages) for p in problems),
                     group_size=4, sampling=SamplingParams(max_new_tokens=6), hacpo=HacpoConfig(mode=mode))
    a, b = make("a", "tiny-llama", finetune=finetune), make("b", "tiny-gpt2")
    first = RoundUpdate("run", None, (), {"a": 1.0, "b": 1.0}, plan, ("a", "b"))
    both = a.step(first).trajectories + b.step(first).trajectories
    return a, tuple(type(t)(**{**t.__dict__, "reward": float((i * 7) % 3 == 0)}) for i, t in enumerate(both))


def params(p: Participant) -> torch.Tensor:
    return torch.cat([x.detach().flatten() for x in p.model.parameters() if x.requires_grad])


def record_forwards(p: Participant) -> list[tuple[int, bool]]:
    """(padded tokens, with grad) of every forward of the participant's policy."""
    seen: list[tuple[int, bool]] = []

    def hook(module, args, kwargs):
        seen.append((int(kwargs["input_ids"].numel()), torch.is_grad_enabled()))

    p.model.register_forward_pre_hook(hook, with_kwargs=True)
    return seen


@pytest.mark.parametrize("mode, minibatch, finetune", [
    ("hacpo", None, "full"),  # sequence-level loss, own + cross samples, KL on own ones
    ("grpo", 5, "full"),  # token-level loss: microbatches weighted by their ratio tokens
    ("xhacpo", None, "full"),  # per-byte cross ratios, peers' failures skipped
    ("gspo", 7, "lora"),  # own samples only; only the adapter trains
])
def test_microbatches_within_the_budget_train_like_one_pass(mode, minibatch, finetune):
    one, pool = mixed_pool(mode, finetune)
    if minibatch:
        one.cfg = dataclasses.replace(one.cfg, minibatch_size=minibatch)
    split = copy.deepcopy(one)  # same weights, optimizer, reference and own-sample cache
    split.cfg = dataclasses.replace(split.cfg, microbatch_tokens=BUDGET)
    before = params(one).clone()
    forwards = record_forwards(split)
    one_forwards = record_forwards(one)
    for r in range(2):
        update = RoundUpdate("run", r, pool, {"a": 0.5, "b": 0.25}, None, ("a", "b"), hacpo=HacpoConfig(mode=mode))
        a, b = one.train_on_pool(update), split.train_on_pool(update)
        assert set(a) == set(b) and a["num_updates"] == b["num_updates"] >= 2
        for key in a:  # grad_norm before clipping: a wrong microbatch weight shows here
            assert math.isclose(a[key], b[key], rel_tol=1e-4, abs_tol=1e-6), (key, a[key], b[key])
    p1, p2 = params(one), params(split)
    moved, diff = float((p1 - before).abs().max()), float((p1 - p2).abs().max())
    assert moved > 1e-5 and diff < 0.01 * moved, (diff, moved)
    trained = [n for n, grad in forwards if grad]
    assert len(trained) > sum(1 for _, grad in one_forwards if grad)  # the budget did split
    assert max(n for n, _ in forwards) <= BUDGET  # training and old-log-prob forwards alike
    assert max(n for n, _ in one_forwards) > BUDGET  # ... where one pass holds more


@pytest.mark.slow
@pytest.mark.parametrize("mode, minibatch", [("hacpo", None), ("grpo", 5)])
def test_two_ranks_with_microbatches_train_like_one_pass(mode, minibatch):
    """Each rank splits its shard within the budget; DDP all-reduces once per minibatch (the last
    microbatch's backward), after the metrics' gather, in the order a one-pass rank keeps."""
    from hacfed.clients.distributed import start_ranks

    one, pool = mixed_pool(mode, "full")
    if minibatch:
        one.cfg = dataclasses.replace(one.cfg, minibatch_size=minibatch)
    twin = copy.deepcopy(one)
    twin.cfg = dataclasses.replace(twin.cfg, microbatch_tokens=BUDGET // 2)  # about one row per microbatch
    ranks = start_ranks(2, [twin])
    forwards = record_forwards(twin)  # after the replicas are made: a hook does not travel
    try:
        twin.attach_ranks(ranks)
        update = RoundUpdate("run", 0, pool, {"a": 0.5, "b": 0.25}, None, ("a", "b"), hacpo=HacpoConfig(mode=mode))
        a, b = one.train_on_pool(update), twin.train_on_pool(update)
        assert set(a) == set(b) and a["num_updates"] == b["num_updates"] >= 2
        for key in a:
            assert math.isclose(a[key], b[key], rel_tol=1e-4, abs_tol=1e-6), (key, a[key], b[key])
        diff = float((params(one) - params(twin)).abs().max())
        assert diff <= 1e-5 * max(1.0, float(params(one).abs().max())), diff
    finally:
        ranks.close()
    assert max(n for n, _ in forwards) <= BUDGET // 2  # rank 0's training and scoring forwards


def test_microbatch_tokens_is_checked():
    with pytest.raises(ValueError, match=r"ParticipantConfig.microbatch_tokens must be an integer >= 1 \(or unset\)"):
        ParticipantConfig("a", "tiny-llama", microbatch_tokens=0)
    assert ParticipantConfig("a", "tiny-llama").microbatch_tokens == 4096
