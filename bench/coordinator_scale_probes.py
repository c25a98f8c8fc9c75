"""Timers and meters of the coordinator scale bench (bench/coordinator_scale.py): exclusive wall
time per phase of the round driver's work, the wrapping of the driver's collaborators with those
timers, this process's peak RSS, the math-verify workers' CPU and memory, and a fixed reference
workload that shows how fast the machine was while a round ran.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

PHASES = ("decode", "intake", "validate", "reward", "journal", "answers", "poll", "close", "pool", "other")


class PhaseClock:
    """Exclusive wall time per phase: time spent in a nested phase is not counted in its parent."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = {p: 0.0 for p in PHASES}
        self._stack: list[list[Any]] = []  # [phase, start, time spent in children]

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        self._stack.append([name, start, 0.0])
        try:
            yield
        finally:
            _, _, children = self._stack.pop()
            elapsed = time.perf_counter() - start
            self.totals[name] += elapsed - children
            if self._stack:
                self._stack[-1][2] += elapsed

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.phase(name):
                return fn(*args, **kwargs)
        return timed

    def wrap_halves(self, name: str, fn: Callable[..., Callable[[], Any]]) -> Callable[..., Callable[[], Any]]:
        """`wrap` of a function that does its work in two halves (it returns the second: a function
        of no arguments, `Coordinator.begin_submit` and the like): both halves are timed as `name`."""
        def timed(*args: Any, **kwargs: Any) -> Callable[[], Any]:
            with self.phase(name):
                return self.wrap(name, fn(*args, **kwargs))
        return timed

    def take(self) -> dict[str, float]:
        out, self.totals = self.totals, {p: 0.0 for p in PHASES}
        return out


@contextmanager
def instrumented(driver: Any, clock: PhaseClock, sizes: list[int]) -> Iterator[None]:
    """Wrap the driver's collaborators with phase timers for the duration of the block, then put
    every original back. Behaviour is unchanged."""
    import hacfed.server.coordinator.intake as intake
    import hacfed.server.coordinator.validation as validation
    import hacfed.server.replies as replies

    saved: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, replacement: Any) -> None:
        saved.append((owner, name, owner.__dict__.get(name, _ABSENT)))
        setattr(owner, name, replacement)

    import hacfed.server.round_updates as round_updates

    try:
        for name in ("open_lab_reply", "open_envelope", "decode_submission"):
            patch(replies, name, clock.wrap("decode", getattr(replies, name)))
        patch(intake, "start_validation", clock.wrap_halves("validate", intake.start_validation))
        patch(validation, "start_verified_rewards", clock.wrap_halves("reward", validation.start_verified_rewards))
        for name in ("record_submission", "used_trajectory_ids", "last_policy_version"):
            patch(driver.journal, name, clock.wrap("journal", getattr(driver.journal, name)))
        patch(driver.answers, "receipt", clock.wrap("answers", driver.answers.receipt))
        splice = round_updates.round_update_parts

        def splice_update(header: Any, items: Any) -> list[bytes]:
            parts = splice(header, items)
            sizes.append(sum(len(p) for p in parts))
            return parts

        # Each lab's update is spliced and sealed in the driver's sealing threads: sizes are recorded
        # there (list.append is atomic), time on the calling thread around all of it.
        patch(round_updates, "round_update_parts", splice_update)
        patch(round_updates, "encode_pool_items", clock.wrap("pool", round_updates.encode_pool_items))
        send = driver.deliveries.send

        def send_round(targets: Any, round_id: int | None, request: Any) -> dict[int, bytes]:
            if round_id is None or round_id < 0:  # answers only, acks, final updates: not a round's pool
                return send(targets, round_id, request)
            with clock.phase("pool"):  # each lab's update sealed into its delivery
                return send(targets, round_id, request)

        patch(driver.deliveries, "send", send_round)
        patch(driver.updates, "for_round", clock.wrap("pool", driver.updates.for_round))
        patch(driver.coordinator, "begin_submit", clock.wrap_halves("intake", driver.coordinator.begin_submit))
        patch(driver.coordinator.engine, "round_update", clock.wrap("pool", driver.coordinator.engine.round_update))
        yield
    finally:
        for owner, name, original in reversed(saved):
            if original is _ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, original)


_ABSENT = object()


class RssSampler:
    """Peak resident memory of this process, sampled every 20 ms in a thread (psutil)."""

    def __init__(self) -> None:
        import psutil

        self._proc = psutil.Process()
        self.peak = self._proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self._proc.memory_info().rss)

    def now(self) -> int:
        return self._proc.memory_info().rss

    def __enter__(self) -> "RssSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.now())


def reference_work_s() -> float:
    """Seconds this process takes for a fixed piece of work like a round's (SHA-256 over 64 MiB,
    protobuf-free Python object churn, JSON), timed after each round: this machine's speed drifts
    3-10x over hours, so a round's time divided by this one says whether a run fell in a slow
    stretch. Not part of any round's time."""
    import hashlib

    block = bytes(range(256)) * 4096  # 1 MiB
    start = time.perf_counter()
    digest = hashlib.sha256()
    for _ in range(64):
        digest.update(block)
    rows = [(f"lab-{i % 64:03d}", i, float(i % 2), f"t{i}") for i in range(100_000)]
    index = {(pid, n): reward for pid, n, reward, _ in rows}
    json.dumps([list(r) for r in rows[:20_000]])
    if len(index) != len(rows) or not digest.digest():
        raise AssertionError("reference work")
    return time.perf_counter() - start


def workers_cpu(verifier: Any) -> dict[int, float]:
    """CPU seconds (user + system) of each live math-verify worker process, by pid: the round's
    verification work that the coordinator process's own CPU time does not include. A worker
    replaced during a round (timeout, retirement) takes its CPU time with it: a lower bound."""
    import psutil

    out = {}
    for pid in verifier.worker_pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        out[pid] = times.user + times.system
    return out


def workers_rss(verifier: Any) -> int:
    """Resident bytes of the live math-verify workers together (not in the coordinator's RSS)."""
    import psutil

    total = 0
    for pid in verifier.worker_pids:
        try:
            total += psutil.Process(pid).memory_info().rss
        except psutil.Error:
            continue
    return total
