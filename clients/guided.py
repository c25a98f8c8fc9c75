"""Guided rollouts (docs/partner_rules.md): a partner's verified success as a hint in the learner's
prompt, and the learner's own continuations of it trained on-policy.

Runs in a lab's participant (`hacfed.clients.participant.Participant.train_on_pool`), before its
update, when the plan's `HacpoConfig.guide_samples` > 0 (mode xhacpo only):

  trigger ....... a prompt whose own group in the pool has mean reward <= `guide_max_own_reward`
                  (0.0: every own sample failed) and at least one partner sample with a verified
                  success (the coordinator's reward > 0, as P̂ counts one, docs/hacpo.md §2)
  hint .......... the shortest such success goes into the last user turn: the partner's whole
                  response (`guide_hint` "response") or only its answer ("answer")
  sampling ...... `guide_samples` continuations of the hinted prompt from the learner's current
                  policy, at the round's sampling settings (temperature, top_p, budget)
  reward ........ agreement with the partner's verified answer through the task's own verifier:
                  `task.verify(problem whose answer is task.answer_of(hint), continuation)`. A lab
                  without answer keys can score them, and a task without `answer_of` refuses the rule
  training ...... the continuations are the learner's own samples of the prompt (its prompt id), so
                  they join its own group for the advantage; `guide_context` "plain" trains them
                  under the original prompt (the hint dropped: STaR's rationalization; the update
                  takes their old log-probs on the plain prompt, so each ratio starts at 1), "hinted"
                  under the hinted prompt (strictly on-policy)

    batch = guided_rollouts(pool, "lab-a", cfg, task, sampler, tokenizer, context=2048, max_prompt_len=2048,
                            max_new_tokens=48, policy_version=3, tag="run/r4")
    batch.trajectories, batch.metrics
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from hacfed.clients.context import fits
from hacfed.hacpo_config import HacpoConfig
from hacfed.messages import SamplingParams
from hacfed.rollout.hf import Completion, generate
from hacfed.tasks.base import Problem, Task
from hacfed.trajectory import ChatMessage, Trajectory, render_prompt_ids

__all__ = ["Rescue", "GuidedBatch", "guide_active", "check_task", "find_rescues", "hinted_prompt", "guided_reward",
           "guided_rollouts", "training_pool", "sampler_for", "HINT_RESPONSE", "HINT_ANSWER"]

HINT_RESPONSE = "\n\nA correct answer from another solver:\n{text}\n\nSolve it yourself."
HINT_ANSWER = "\n\nThe correct answer is {answer}. Solve it yourself."

# prompts (hinted), samples per prompt -> [prompt][sample] completions of the learner's current policy
Sampler = Callable[[Sequence[Sequence[ChatMessage]], int], list[list[Completion]]]


def guide_active(cfg: HacpoConfig) -> bool:
    return cfg.mode == "xhacpo" and cfg.guide_samples > 0


def check_task(task: Task) -> None:
    """Refuse guided rollouts for a task that cannot read an answer from a response."""
    if not callable(getattr(task, "answer_of", None)):
        raise ValueError(f"guided rollouts (guide_samples > 0) need a task that reads the answer of a response "
                         f"(answer_of: arithmetic, chain, math data); task {task.name!r} has none")


@dataclass(frozen=True)
class Rescue:
    """One prompt the learner fell short on, with the partner success that guides it."""

    prompt_id: str
    prompt: tuple[ChatMessage, ...]  # the original prompt
    hint: Trajectory  # the partner's verified success
    answer: str  # its answer, as the task reads it (`answer_of`)


def find_rescues(pool: Sequence[Trajectory], learner: str, cfg: HacpoConfig, task: Task) -> tuple[list[Rescue], int]:
    """(rescues in the order of the pool's own groups, prompts the learner fell short on).

    A prompt qualifies when the learner's own group on it has mean reward <= guide_max_own_reward;
    a prompt without own samples does not (nothing says the learner fell short). It is rescued when
    a partner sample of it is a verified success whose answer the task can read; of several, the
    shortest text (the first in pool order among equals)."""
    own: dict[str, list[Trajectory]] = {}
    for t in pool:
        if t.source_id == learner:
            own.setdefault(t.prompt_id, []).append(t)
    mean = {p: math.fsum(t.reward for t in group) / len(group) for p, group in own.items()}
    short = [p for p in own if mean[p] <= cfg.guide_max_own_reward]
    best: dict[str, tuple[Trajectory, str]] = {}
    for t in pool:
        if t.source_id == learner or t.reward <= 0 or t.prompt_id not in own:
            continue
        answer = task.answer_of(t.response_text)
        held = best.get(t.prompt_id)
        if answer is not None and (held is None or len(t.response_text) < len(held[0].response_text)):
            best[t.prompt_id] = (t, answer)
    rescues = [Rescue(p, own[p][0].prompt, *best[p]) for p in short if p in best]
    return rescues, len(short)


def hinted_prompt(rescue: Rescue, form: str) -> tuple[ChatMessage, ...]:
    """The original prompt with the hint appended to its last user turn (a new user turn when the
    prompt does not end with one)."""
    if form == "response":
        hint = HINT_RESPONSE.format(text=rescue.hint.response_text.strip())
    elif form == "answer":
        hint = HINT_ANSWER.format(answer=rescue.answer)
    else:
        raise ValueError(f"guide_hint must be 'response' or 'answer', got {form!r}")
    *head, last = rescue.prompt
    if last.role == "user":
        return (*head, ChatMessage("user", last.content + hint))
    return (*rescue.prompt, ChatMessage("user", hint.strip()))


def guided_reward(task: Task, rescue: Rescue, text: str) -> float:
    """A continuation's reward: the task's verifier with the partner's verified answer as the gold one."""
    problem = Problem(rescue.prompt_id, rescue.prompt, answer=rescue.answer, solution="")
    return float(task.verify(problem, text).reward)


@dataclass(frozen=True)
class GuidedBatch:
    """The guided continuations to train on (own samples of their prompts) and the update's metrics."""

    trajectories: tuple[Trajectory, ...]
    metrics: dict[str, float]


def guided_rollouts(
    pool: Sequence[Trajectory], learner: str, cfg: HacpoConfig, task: Task, sample: Sampler, tokenizer: Any, *,
    context: int, max_prompt_len: int, max_new_tokens: int, policy_version: int, tag: str,
) -> GuidedBatch:
    """Sample, score and shape the guided continuations of one pool (module docstring).

    A rescue whose hinted prompt leaves less than `max_new_tokens` + EOS in the learner's `context`
    (or, trained hinted, exceeds `max_prompt_len`) is skipped, as is a continuation whose training
    view does not fit: both are counted in `guide/skipped_context`."""
    rescues, short = find_rescues(pool, learner, cfg, task)
    prompts, ready = [], []
    for r in rescues:
        hinted = hinted_prompt(r, cfg.guide_hint)
        length = len(render_prompt_ids(tokenizer, hinted))
        if length + max_new_tokens + 1 <= context and (cfg.guide_context == "plain" or length <= max_prompt_len):
            prompts.append(hinted)
            ready.append(r)
    groups = sample(prompts, cfg.guide_samples) if prompts else []
    out: list[Trajectory] = []
    skipped = len(rescues) - len(ready)
    for r, hinted, completions in zip(ready, prompts, groups):
        for k, c in enumerate(completions):
            t = Trajectory(
                trajectory_id=f"{tag}/{learner}/guided/{r.prompt_id}/{k}", prompt_id=r.prompt_id, source_id=learner,
                policy_version=policy_version, prompt=r.prompt if cfg.guide_context == "plain" else hinted,
                response_text=c.text, reward=guided_reward(task, r, c.text),
                source_logp_sum=min(float(c.logprob_sum), 0.0), source_token_count=len(c.token_ids),
                finish_reason=c.finish_reason, response_token_ids=tuple(int(i) for i in c.token_ids),
            )
            if fits(t, learner, tokenizer, context):
                out.append(t)
            else:
                skipped += 1
    partners = sum(t.source_id != learner for t in pool)
    metrics = {"guide/short_prompts": float(short), "guide/prompts": float(len(ready)),
               "guide/samples": float(len(out)), "guide/skipped_context": float(skipped)}
    if out:
        metrics["guide/success_frac"] = math.fsum(t.reward for t in out) / len(out)
    if partners:
        metrics["partner/in_context_frac"] = len(ready) / partners
        if cfg.partner_use == "context":
            metrics["partner/grad_frac"] = 0.0
    return GuidedBatch(tuple(out), metrics)


def training_pool(pool: Sequence[Trajectory], learner: str, cfg: HacpoConfig) -> tuple[Trajectory, ...]:
    """The pool the update trains on: with `partner_use` "context" the learner's own samples only
    (partners' samples served as hints and carry no gradient), else the whole pool."""
    if cfg.partner_use == "context":
        return tuple(t for t in pool if t.source_id == learner)
    if cfg.partner_use == "gradient":
        return tuple(pool)
    raise ValueError(f"partner_use must be 'gradient' or 'context', got {cfg.partner_use!r}")


def sampler_for(model: Any, tokenizer: Any, sampling: SamplingParams, seed: int, batch_size: int,
                vllm: Any = None) -> Sampler:
    """The learner's own rollout at the round's sampling settings, as a `Sampler`."""

    def sample(prompts: Sequence[Sequence[ChatMessage]], n: int) -> list[list[Completion]]:
        kwargs = dict(num_samples=n, max_new_tokens=sampling.max_new_tokens, temperature=sampling.temperature,
                      top_p=sampling.top_p, seed=seed)
        if vllm is not None:
            return vllm.generate(model, tokenizer, list(prompts), **kwargs)
        return generate(model, tokenizer, list(prompts), batch_size=batch_size, **kwargs)

    return sample
