"""A participant's rollout and evaluation: sampling a round's plan, and greedy held-out accuracy.

Runs in a lab's hacfed-client process (and in `hacfed sim`), called by `Participant.step`
(`hacfed.clients.participant`). Rollouts use the plan's sampling settings with the participant's
current policy, through transformers (`hacfed.rollout.hf`) or a vLLM engine that serves a copy of
the policy exported to disk; every reward is a local claim that the coordinator re-verifies (none when
the coordinator holds the answer keys). Held-out evaluation scores the lab's own local task.
"""

from __future__ import annotations

import copy
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hacfed.messages import RoundPlan
from hacfed.rollout.greedy_eval import greedy_rewards
from hacfed.rollout.hf import evaluate_sampled, generate
from hacfed.tasks.base import Problem, Task
from hacfed.trajectory import Trajectory


def rollout_plan(
    model: Any, tokenizer: Any, task: Task, plan: RoundPlan, *, participant_id: str, policy_version: int,
    base_seed: int, batch_size: int, vllm: Any = None,
) -> tuple[Trajectory, ...]:
    """G samples per planned prompt at the plan's sampling settings; rewards are local claims, or,
    when the coordinator holds the answer keys (`plan.answer_keys`), 0.0: no claim, and no answer
    looked up (the plan's prompts need not be in the local task)."""
    claims = plan.answer_keys == "public"
    seed = derive_seed(base_seed, plan.run_id, plan.round_id, participant_id)
    prompts = [p.messages for p in plan.prompts]
    kwargs = dict(
        num_samples=plan.group_size, max_new_tokens=plan.sampling.max_new_tokens,
        temperature=plan.sampling.temperature, top_p=plan.sampling.top_p, seed=seed,
    )
    if vllm is not None:
        groups = vllm.generate(model, tokenizer, prompts, **kwargs)
    else:
        groups = generate(model, tokenizer, prompts, batch_size=batch_size, **kwargs)
    out: list[Trajectory] = []
    for planned, completions in zip(plan.prompts, groups):
        problem = task.problem(planned.prompt_id) if claims else None
        for k, c in enumerate(completions):
            out.append(
                Trajectory(
                    trajectory_id=f"{plan.run_id}/r{plan.round_id}/{participant_id}/{planned.prompt_id}/{k}",
                    prompt_id=planned.prompt_id,
                    source_id=participant_id,
                    policy_version=policy_version,
                    prompt=planned.messages,
                    response_text=c.text,
                    reward=float(task.verify(problem, c.text).reward) if claims else 0.0,
                    source_logp_sum=min(float(c.logprob_sum), 0.0),
                    source_token_count=len(c.token_ids),
                    finish_reason=c.finish_reason,
                    response_token_ids=tuple(int(i) for i in c.token_ids),
                )
            )
    return tuple(out)


@dataclass(frozen=True)
class Evaluation:
    """Held-out scores: greedy accuracy, and sampled pass@1 (one temperature-1 sample per problem)."""

    greedy: float
    pass1: float | None = None
    # Greedy accuracy on each half of a task mix that has halves (hacfed.tasks.chain.half_of), e.g.
    # {"sym": 0.41, "word": 0.22}: which half an agent learnt. Empty for a task without halves.
    greedy_by_half: dict[str, float] = field(default_factory=dict)


def evaluate_held_out(model: Any, tokenizer: Any, task: Task, max_problems: int, max_new_tokens: int, *,
                      split: str = "test", sampled: bool = False, seed: int = 0) -> Evaluation:
    """Scores on the first `max_problems` problems of the task's test split, or of its validation
    split (for choosing settings: never tune on the test split). The sampled pass@1 is seeded, so
    two runs that reach the same policy score it identically."""
    if split == "validation":
        if not hasattr(task, "validation_problems"):
            raise ValueError(f"task {task.name} has no validation split")
        pool = task.validation_problems()
        if not pool:
            raise ValueError(f"task {task.name} has an empty validation split (its [task] sets no num_validation)")
    elif split == "test":
        pool = task.eval_problems()
    else:
        raise ValueError(f"evaluation split must be 'test' or 'validation', got {split!r}")
    problems = list(pool)[:max_problems]
    rewards = greedy_rewards(model, tokenizer, task, problems, max_new_tokens=max_new_tokens)
    greedy = math.fsum(rewards) / len(rewards)
    pass1 = None
    if sampled:
        pass1 = evaluate_sampled(model, tokenizer, task, problems, max_new_tokens=max_new_tokens, seed=seed)
    return Evaluation(greedy, pass1, scores_by_half(task, problems, rewards))


def scores_by_half(task: Task, problems: Sequence[Problem], rewards: Sequence[float]) -> dict[str, float]:
    """Mean reward per half of the task's mix, for a task that names the halves (`half_of`)."""
    half_of = getattr(task, "half_of", None)
    if half_of is None:
        return {}
    by_half: dict[str, list[float]] = {}
    for problem, reward in zip(problems, rewards):
        half = half_of(problem)
        if half is not None:
            by_half.setdefault(half, []).append(reward)
    return {half: math.fsum(r) / len(r) for half, r in sorted(by_half.items())} if len(by_half) > 1 else {}


def export_for_vllm(model: Any, tokenizer: Any, checkpoint_dir: str | None, finetune: str) -> Path:
    """Write the current policy where the vLLM engine loads it from (`<checkpoint_dir>/vllm-policy`)."""
    if not checkpoint_dir:
        raise ValueError("rollout_backend 'vllm' needs checkpoint_dir (vLLM loads the policy from disk)")
    target = Path(checkpoint_dir) / "vllm-policy"
    if finetune == "lora":
        # Merge a copy: the live model keeps its adapter for training.
        model = copy.deepcopy(model).merge_and_unload()
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


def derive_seed(seed: int, run_id: str, round_id: int, participant: str) -> int:
    digest = hashlib.sha256(f"{seed}|{run_id}|{round_id}|{participant}".encode()).digest()
    return int.from_bytes(digest[:4], "little")
