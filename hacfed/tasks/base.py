"""The task interface shared by the coordinator (verification) and participants (prompts, SFT)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Protocol, Sequence

from hacfed.trajectory import ChatMessage


@dataclass(frozen=True)
class Problem:
    """One task item. `prompt_id` is stable across runs and machines (derived from content/seed)."""

    prompt_id: str
    messages: tuple[ChatMessage, ...]
    answer: str  # the gold answer in the task's canonical form
    solution: str  # a reference completion for supervised warm-up (ends where the model should stop)


@dataclass(frozen=True)
class Verdict:
    reward: float
    reason: str = ""


class Task(Protocol):
    """A verifiable task. Implementations: `hacfed.tasks.arithmetic.ArithmeticTask`, ..."""

    name: str

    def train_problems(self) -> Sequence[Problem]: ...

    def eval_problems(self) -> Sequence[Problem]: ...

    def problem(self, prompt_id: str) -> Problem: ...

    def verify(self, problem: Problem, response: str) -> Verdict: ...

    # Optional: `answer_of(response: str) -> str | None`, the answer a response gives as `verify`
    # reads it, in the form of `Problem.answer` (None for none): a lab without answer keys scores
    # its guided rollouts by agreement with a partner's verified answer (`hacfed.clients.guided`).
    # Arithmetic, chain and the math-data tasks have it; a task without it refuses guided rollouts.
    #
    # Optional: `start_verify_batch(items: Sequence[tuple[Problem, str]], budget_s: float | None)
    # -> Callable[[], list[Verdict]]`,
    # for a task that verifies a batch faster than item by item (the GSM8K-style `MathDataTask`: its
    # math-verify requests run while the rest is screened). It does what needs the caller's thread
    # now and returns a function that waits for the rest and gives `verify` of each item, in order,
    # so the coordinator can judge the next submission meanwhile. The coordinator uses it when
    # present and `verify_threads` > 1; the verdicts must be `verify`'s. When the batch's
    # verification takes more than `budget_s` seconds, that function raises
    # `hacfed.tasks.verify_budget.VerifyBudgetSpent` instead.


class SplitLookup:
    """Shared lookups for tasks whose `_splits` is (train problems, held-out problems)."""

    name: str
    _splits: tuple[tuple[Problem, ...], tuple[Problem, ...]]

    def train_problems(self) -> tuple[Problem, ...]:
        return self._splits[0]

    def eval_problems(self) -> tuple[Problem, ...]:
        return self._splits[1]

    @cached_property
    def _by_id(self) -> dict[str, Problem]:
        return {p.prompt_id: p for split in self._splits for p in split}

    def problem(self, prompt_id: str) -> Problem:
        try:
            return self._by_id[prompt_id]
        except KeyError:
            raise KeyError(f"unknown prompt id {prompt_id!r} for task {self.name}") from None
