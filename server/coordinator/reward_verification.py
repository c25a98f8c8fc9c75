"""Re-verification of a submission's rewards with the task's verifier, over a few threads.

Runs in the coordinator's ServerApp process and, in-process, in `hacfed sim`, called by
`validation.start_validation` with the samples of every group that passed the cheap checks.

The samples are split over `threads` threads (`verified_rewards`): math-verify runs in sandboxed
worker processes (`hacfed.tasks.math_verifier`, `parallel_workers`), and while one thread waits
for its worker the other screens its samples in process, so a submission's verification uses both
cores instead of one thread waiting on one worker (bench/coordinator_scale.py). A task that
verifies a batch itself (`start_verify_batch`: GSM8K-style math tasks) gets the whole batch
instead: one thread screens every sample while helper threads keep the workers busy with the
samples only math-verify decides, as they are found, and the verdicts are collected when the
outcome is asked for (`start_verified_rewards`). The verdicts do not depend on the number of
threads: each sample's verdict is a function of its (gold, response) alone.

Each submission's verification is bounded in time as a whole (`ValidationLimits.verify_budget_s`,
`hacfed.tasks.verify_budget`): past the budget nothing more of it is verified and its outcome
raises `VerifyBudgetSpent`, which `validation` turns into the submission's refusal.
"""

from __future__ import annotations

import inspect
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

from hacfed.tasks.base import Task
from hacfed.tasks.verify_budget import VerifyBudget
from hacfed.trajectory import Trajectory

MIN_SAMPLES_PER_THREAD = 64  # below this a helper thread costs more than it saves


def start_verified_rewards(
    task: Task, items: list[tuple[Any, Trajectory]], threads: int, budget_s: float | None = None,
) -> Callable[[], list[float]]:
    """The verified rewards of `items`: from the task's `start_verify_batch` when it has one and
    `threads` > 1 (its requests are sent now, the function returned waits for them), else computed
    now (`verified_rewards`). budget_s: the most seconds the batch's verification may take
    (`hacfed.tasks.verify_budget`); past it the function returned raises `VerifyBudgetSpent`."""
    start = getattr(task, "start_verify_batch", None)
    if threads > 1 and callable(start):
        pairs = [(problem, t.response_text) for problem, t in items]
        pending = start(pairs, budget_s) if _takes_budget(start) else start(pairs)
        return lambda: _checked_rewards(task, pending(), len(items))
    budget = VerifyBudget(budget_s)
    rewards = verified_rewards(task, items, threads, budget)

    def done() -> list[float]:
        budget.check()
        return rewards

    return done


def _takes_budget(start: Callable[..., Any]) -> bool:
    """Whether a task's `start_verify_batch` takes `budget_s` (one that does not verifies unbounded)."""
    try:
        return "budget_s" in inspect.signature(start).parameters
    except (TypeError, ValueError):
        return False


def _checked_rewards(task: Task, verdicts: Sequence[Any], n: int) -> list[float]:
    if len(verdicts) != n:
        raise ValueError(f"task {task.name!r} start_verify_batch gave {len(verdicts)} verdicts for {n} samples")
    return [_checked_reward(task, v.reward) for v in verdicts]


def verified_rewards(
    task: Task, items: list[tuple[Any, Trajectory]], threads: int, budget: VerifyBudget | None = None,
) -> list[float]:
    """`_verified_reward` of each (problem, sample), in order, over at most `threads` threads
    (contiguous slices, the first in the calling thread); a verifier error propagates. (A task with
    `start_verify_batch` gets the whole batch instead: `start_verified_rewards`.) With a `budget`,
    each sample's time is charged to it and, once it is spent, the rest score 0 unverified (the
    caller refuses the batch: `budget.check()`)."""
    budget = budget or VerifyBudget(None)
    n = min(threads, len(items) // MIN_SAMPLES_PER_THREAD) if threads > 1 else 1
    if n <= 1:
        return [_verified_reward(task, problem, t, budget) for problem, t in items]
    bounds = [len(items) * i // n for i in range(n + 1)]
    slices = [items[bounds[i]:bounds[i + 1]] for i in range(n)]

    def run(part: list[tuple[Any, Trajectory]]) -> list[float]:
        return [_verified_reward(task, problem, t, budget) for problem, t in part]

    futures = [_helpers().submit(run, part) for part in slices[1:]]
    first = run(slices[0])
    return first + [r for f in futures for r in f.result()]


_HELPERS: ThreadPoolExecutor | None = None
_HELPERS_LOCK = threading.Lock()


def _helpers() -> ThreadPoolExecutor:
    """The verification helper threads, started on first use and shared by every coordinator of
    the process (each call waits for its own futures; 7 = the most `verify_threads` asks besides
    the caller)."""
    global _HELPERS
    with _HELPERS_LOCK:
        if _HELPERS is None:
            _HELPERS = ThreadPoolExecutor(max_workers=7, thread_name_prefix="hacfed-verify")
        return _HELPERS


def _verified_reward(task: Task, problem: Any, t: Trajectory, budget: VerifyBudget) -> float:
    if budget.exhausted:
        return 0.0
    started = time.monotonic()
    try:
        return _checked_reward(task, task.verify(problem, t.response_text).reward)
    finally:
        budget.charge(time.monotonic() - started)


def _checked_reward(task: Task, reward: object) -> float:
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not (0.0 <= reward <= 1.0):
        raise ValueError(f"task {task.name!r} verifier returned reward {reward!r} outside [0, 1]")
    return float(reward)
