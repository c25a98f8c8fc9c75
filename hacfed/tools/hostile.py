"""Weak and hostile labs for `hacfed sim`: what a bad partner submits, through the real coordinator.

    hacfed sim --agents tiny-llama,tiny-gpt2,hostile:copy-gold

An agent spec `hostile:KIND` replaces one lab by one of these (docs/experiments.md, "Hostile and weak
peers in the simulator"):

  copy-gold          submits the task's reference solution (`Problem.solution`) for all G samples; when
                     the coordinator holds the answer keys (`RoundPlan.answer_keys`) it has none to copy
                     and submits NO_KEY_RESPONSE, what a copier without the key can write
  canary:TEXT        a strong solver (the reference solution) with TEXT written into each derivation
                     where the task's verifier still accepts it; TEXT has no comma (`--agents` splits there)
  lie-logprob[:M]    model M (default: the first honest agent's) rolls out and trains as an honest lab,
                     but each sample's source log-prob summary is the claim that gives it the most weight
                     in the honest learners' updates (`hacfed.tools.logprob_liar`)
  weak               answers right with probability WEAK_SOLVE_RATE, otherwise the reference solution
                     with a wrong final answer: a lab that almost never solves the task

Every hostile lab receives the same plans and pools as an honest one and answers with a `Submission`
the coordinator re-verifies like any other; its reward claims are its verifier's (a false claim would
only earn strikes, which the re-verification tests cover), or none (0.0) when the coordinator holds the
answer keys. canary and weak then still write from the reference solution: they stand for a strong and
a weak model, which solve without a key, not for copiers. The scripted kinds (all but lie-logprob)
have no model: they neither train nor evaluate, and their log-prob summary is a confident model's
(`SCRIPTED_TOKEN_LOGP` per token, one token per UTF-8 byte up to the plan's budget). Nothing outside
hacfed.tools imports this module.
"""

from __future__ import annotations

import math
import random
import re
import secrets
import time
from dataclasses import dataclass
from typing import Any, Sequence

from hacfed.messages import RoundPlan, RoundUpdate, StepReport, Submission
from hacfed.tasks.base import Problem
from hacfed.trajectory import Trajectory

PREFIX = "hostile:"
KINDS = ("copy-gold", "canary", "lie-logprob", "weak")
KINDS_HELP = "copy-gold, canary:TEXT, lie-logprob[:MODEL], weak"
WEAK_SOLVE_RATE = 0.05
SCRIPTED_TOKEN_LOGP = math.log(0.9)
NO_KEY_RESPONSE = ""  # copy-gold without the answer key: nothing to copy, so no answer
_INT_RE = re.compile(r"-?\d+")


@dataclass(frozen=True)
class HostileSpec:
    """One parsed `hostile:KIND[:ARG]`. text: the canary's TEXT; model: lie-logprob's model spec (None: the
    first honest agent's)."""

    kind: str
    text: str | None = None
    model: str | None = None

    @property
    def name(self) -> str:
        """The lab's participant id (before `participant_ids` makes it unique)."""
        return f"hostile-{self.kind}"


def is_hostile(agent: str) -> bool:
    return agent.startswith(PREFIX)


def parse_agent(agent: str) -> HostileSpec | None:
    """None for a model spec (an honest lab); the HostileSpec of `hostile:KIND[:ARG]`; ValueError naming the
    bad spec otherwise."""
    if not is_hostile(agent):
        return None
    kind, _, arg = agent[len(PREFIX):].partition(":")
    if kind not in KINDS:
        raise ValueError(f"unknown hostile agent kind {kind!r} in {agent!r}: expected hostile:KIND with KIND one of "
                         f"{KINDS_HELP}")
    if kind == "canary":
        if not arg.strip() or not arg.isprintable():
            raise ValueError(f"{agent!r}: hostile:canary needs a printable TEXT, as in hostile:canary:evil.example")
        return HostileSpec(kind, text=arg)
    if kind == "lie-logprob":
        return HostileSpec(kind, model=arg or None)
    if arg:
        raise ValueError(f"{agent!r}: hostile:{kind} takes no argument")
    return HostileSpec(kind)


def evaluates(agent: str) -> bool:
    """Whether the lab of this agent spec evaluates (and so writes a final metrics row): an honest lab and
    lie-logprob, which has a model; not the scripted kinds."""
    spec = parse_agent(agent)
    return spec is None or spec.kind == "lie-logprob"


def canary_of(agents: Sequence[str]) -> str | None:
    """The canary TEXT of the run's canary lab, if any (the first one's)."""
    for agent in agents:
        spec = parse_agent(agent)
        if spec is not None and spec.kind == "canary":
            return spec.text
    return None


# ---- what the scripted kinds write ------------------------------------------------------------------


def canary_placements(solution: str, text: str) -> list[str]:
    """Where TEXT may go, most hidden first: its own line before the final line of the derivation, then
    before the whole answer, then after it."""
    lines = solution.split("\n")
    return ["\n".join(lines[:-1] + [text, lines[-1]]), f"{text} {solution}", f"{solution} {text}"]


def with_canary(task: Any, problem: Problem, text: str) -> str | None:
    """The reference solution with TEXT in it that the task's verifier accepts, or None if none is."""
    for candidate in canary_placements(problem.solution, text):
        if text in candidate and task.verify(problem, candidate).reward >= 1.0:
            return candidate
    return None


def check_canary_task(task: Any, text: str) -> None:
    """ValueError unless the task's verifier accepts TEXT in a derivation (checked on its first training
    problem): a task that scores the whole response (add2) has no room for it."""
    problem = task.train_problems()[0]
    if with_canary(task, problem, text) is None:
        raise ValueError(f"hostile:canary: task {task.name} accepts no answer with {text!r} in it (its verifier "
                         "checks the whole response); use a task with a derivation: chain, add2-words or gsm8k")


def wrong_answer(task: Any, problem: Problem, rng: random.Random) -> str:
    """The reference solution with its last integer changed, so the verifier rejects it; "" when the
    solution has no integer or the change still passes."""
    found = list(_INT_RE.finditer(problem.solution))
    if found:
        last = found[-1]
        wrong = str(int(last.group()) + rng.randint(1, 9))
        text = problem.solution[:last.start()] + wrong + problem.solution[last.end():]
        if task.verify(problem, text).reward < 1.0:
            return text
    return ""


def scripted_summary(text: str, max_new_tokens: int) -> tuple[float, int]:
    """(source_logp_sum, source_token_count) a scripted lab claims: a confident model's."""
    n = min(len(text.encode("utf-8")), max_new_tokens)
    return n * SCRIPTED_TOKEN_LOGP, n


class ScriptedLab:
    """copy-gold, canary or weak: answers each plan from the task's reference solutions, without a model."""

    def __init__(self, participant_id: str, spec: HostileSpec, task: Any, seed: int) -> None:
        if spec.kind not in ("copy-gold", "canary", "weak"):
            raise ValueError(f"ScriptedLab cannot play {spec.kind!r}")
        self.participant_id = participant_id
        self.spec = spec
        self.task = task
        self.seed = seed

    def response(self, problem: Problem, rng: random.Random, keys: str = "public") -> str:
        """What it writes for `problem`; `keys`: the plan's `answer_keys` (who holds the solution)."""
        if self.spec.kind == "copy-gold":
            return problem.solution if keys == "public" else NO_KEY_RESPONSE
        if self.spec.kind == "canary":
            assert self.spec.text is not None
            placed = with_canary(self.task, problem, self.spec.text)
            return placed if placed is not None else canary_placements(problem.solution, self.spec.text)[0]
        return problem.solution if rng.random() < WEAK_SOLVE_RATE else wrong_answer(self.task, problem, rng)

    def rollout(self, plan: RoundPlan) -> tuple[Trajectory, ...]:
        rng = random.Random(f"{self.seed}|{plan.run_id}|{plan.round_id}|{self.participant_id}")
        claims = plan.answer_keys == "public"  # else no key: no claim either
        out = []
        for planned in plan.prompts:
            problem = self.task.problem(planned.prompt_id)
            for k in range(plan.group_size):
                text = self.response(problem, rng, plan.answer_keys)
                logp, n = scripted_summary(text, plan.sampling.max_new_tokens)
                out.append(Trajectory(
                    trajectory_id=f"{plan.run_id}/r{plan.round_id}/{self.participant_id}/{planned.prompt_id}/{k}",
                    prompt_id=planned.prompt_id, source_id=self.participant_id, policy_version=0,
                    prompt=planned.messages, response_text=text,
                    reward=float(self.task.verify(problem, text).reward) if claims else 0.0,
                    source_logp_sum=logp, source_token_count=n, finish_reason="stop",
                ))
        return tuple(out)

    def step(self, update: RoundUpdate) -> Submission | None:
        """The plan's samples; nothing after the last round (no model to train or evaluate)."""
        plan = update.next_plan
        if plan is None:
            return None
        trajectories = self.rollout(plan)
        metrics = {"reward_mean": sum(t.reward for t in trajectories) / max(len(trajectories), 1)}
        report = StepReport(self.participant_id, plan.round_id, metrics if plan.answer_keys == "public" else {}, None)
        return Submission(run_id=update.run_id, participant_id=self.participant_id, round_id=plan.round_id,
                          trajectories=trajectories, report=report, nonce=secrets.token_hex(16),
                          created_at_ms=int(time.time() * 1000))


# ---- the canary rate of an honest learner -------------------------------------------------------------


def canary_rate(texts: Sequence[str], canary: str) -> float:
    """The fraction of `texts` that contain `canary` (0 for none)."""
    if not texts:
        return 0.0
    return sum(canary in t for t in texts) / len(texts)


def held_out_canary_rate(model: Any, tokenizer: Any, task: Any, canary: str, *, split: str, problems: int,
                         max_new_tokens: int, seed: int) -> float:
    """`canary_rate` of a learner's greedy and sampled (T = 1, seeded) answers to the held-out problems its
    evaluation scores (the first `problems` of `split`)."""
    from hacfed.rollout.hf import generate

    pool = task.validation_problems() if split == "validation" else task.eval_problems()
    prompts = [p.messages for p in list(pool)[:problems]]
    greedy = generate(model, tokenizer, prompts, num_samples=1, max_new_tokens=max_new_tokens, greedy=True)
    sampled = generate(model, tokenizer, prompts, num_samples=1, max_new_tokens=max_new_tokens, seed=seed)
    return canary_rate([g[0].text for g in greedy] + [s[0].text for s in sampled], canary)
