"""Math answer verification on `math-verify`, with model text kept out of the caller's process.

Pipeline for one (gold, response) pair, cheapest first; any refusal is reward 0 with a reason:
  1. in-process pre-checks on the raw response: text, at most `max_response_chars`, no NUL, valid
     Unicode (no lone surrogates);
  2. in-process extraction of the final answer (`hacfed.tasks.math_answers`): the last `\\boxed{}`
     and/or the last plain number;
  3. answer checks: non-empty, at most `max_answer_chars`, bracket nesting ((, [, {) at most
     `max_nesting` (math-verify's LaTeX parser is exponential in nesting: 15 bare braces take ~2 s,
     95 parentheses time out); and, for an answer the fast path does not decide, its size
     (`math_answers.size_refusal`): sympy evaluates integer powers and factorials exactly, in C
     code no signal interrupts, so `\\boxed{9^{9^{9^{9}}}}` ran into the 5 s wall timeout. An
     exponent over `max_exponent`, a factorial of more than `max_factorial`, an integer literal of
     more than `max_integer_digits` digits or a part whose value may have more than
     `max_value_digits` digits (bounds from above, a letter standing for 2) is refused in process;
  4. numeric fast path (`numeric_fast_path`): when gold and answer are both plain decimals
     (optional sign, optional 1,000-style grouping), they are compared exactly as `Decimal`s, in
     process, without the worker. This decides most GSM8K items. It is exact where math-verify
     rounds to 6 places, so "0.3333333" vs gold "0.333333" is 0 here. An answer that is a dollar
     sign and a plain decimal in ASCII digits (`\\$72`, `\\$ 1,080.50`: money, the commonest non-plain GSM8K
     answer) is compared the same way, by its number: math-verify drops the sign and gives the same
     verdict (tests/unit/test_parallel_verify.py checks both on a grid of forms);
  5. otherwise the sandboxed worker (`hacfed.tasks.sandbox` running `hacfed.tasks.math_worker`)
     parses both sides with math-verify's LaTeX parser only (no `ExprExtractionConfig`, which goes
     through sympy's `parse_expr`/`eval`) and calls `math_verify.verify`. Timeouts, crashes and limits become
     "HACFED-E-VERIFIER-ABORT: ..." with reward 0.

Worker verdicts are cached per verifier in a bounded LRU (`verdict_cache_entries`), keyed on exactly
the request the worker sees: (stripped gold, stripped extracted answer). The worker's reply is a
function of that request alone (its limits and math-verify are fixed per verifier), so a cached
verdict is the one the worker would give again; a lab can only fill entries for its own answers,
which hold their true verdicts, and evict others' (costing the coordinator round trips, not
correctness). Aborts (timeout, crash, refusal, memory) may be transient and are never cached.

Workers: up to `parallel_workers` sandboxed workers, each started only when every started one is
busy with another caller's request. A caller that verifies one item at a time (a lab scoring its
rollouts) never starts a second. The coordinator verifies a submission as one batch
(`start_concurrently`, through `MathDataTask.start_verify_batch` and
`hacfed.server.coordinator.validation`): its thread screens every sample in process and hands each
request for math-verify, as it finds one, to a helper thread per worker, so both workers are kept
busy while the screening goes on. A request another thread is already sending for the same
(gold, answer) waits for that verdict instead of asking a second worker.
One gap: math-verify catches `Exception` inside itself, MemoryError and RecursionError included,
and answers "not equal", so such a failure would be cached like a real 0; step 3's caps bound
what one answer can make it parse.
Every lab answers the same prompts, so at the coordinator pairs repeat: in `bench/verifier_cache.py`
at 64 labs, 1,305 items per round need the worker and 814 of them are distinct.

    with MathVerifier() as v:
        v.verify("72", "... so she sold \\boxed{72} clips.")   # Verdict(1.0, 'numeric match')
        v.verify("0.5", "\\boxed{\\frac{1}{2}}")             # Verdict(1.0, 'equivalent (math-verify)')
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Iterable

from hacfed.tasks.base import Verdict
from hacfed.tasks.math_answers import (
    ANSWER_MODES,
    DOLLAR,
    AnswerMode,
    dollar_amount,
    extract_answer,
    nesting_depth,
    plain_answer,
    plain_gold,
    size_refusal,
)
from hacfed.tasks.sandbox import VERIFIER_ABORT, SandboxAbort, SandboxedWorker, SandboxLimits
from hacfed.tasks.verdict_cache import VerdictCache, WorkerKey
from hacfed.tasks.verify_budget import VerifyBudget

WORKER_FACTORY = "hacfed.tasks.math_worker:worker_handler"  # what the sandboxed worker runs
MAX_PARALLEL_WORKERS = 8


@dataclass(frozen=True)
class MathVerifierConfig:
    """answer_mode: where the final answer is taken from ("boxed": last \\boxed{}; "last_number": the
    last number in the text; "boxed_or_last_number": boxed if present, else the last number).
    verdict_cache_entries: most worker verdicts kept in the LRU cache (0: no cache). An entry holds
    the gold, an answer of at most max_answer_chars and a reason of at most 100 chars: measured at
    ~0.35 KB for GSM8K-sized answers and ~0.7 KB at the 200-char limit, so 22-43 MiB when full at
    the default.
    parallel_workers: most sandboxed workers serving concurrent callers (each ~100-200 MiB, each
    under the same `sandbox` limits); a second one starts only while the first is busy."""

    answer_mode: AnswerMode = "boxed"
    max_response_chars: int = 10_000
    max_answer_chars: int = 200
    max_nesting: int = 8
    max_exponent: int = 10_000
    max_factorial: int = 10_000
    max_integer_digits: int = 40
    max_value_digits: int = 100_000
    numeric_fast_path: bool = True
    verdict_cache_entries: int = 65_536
    parallel_workers: int = 2
    sandbox: SandboxLimits = field(default_factory=SandboxLimits)

    def __post_init__(self) -> None:
        if self.answer_mode not in ANSWER_MODES:
            raise ValueError(f"MathVerifierConfig.answer_mode must be one of {ANSWER_MODES}, got {self.answer_mode!r}")
        for name in ("max_response_chars", "max_answer_chars", "max_nesting", "max_exponent", "max_factorial",
                     "max_integer_digits", "max_value_digits", "parallel_workers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"MathVerifierConfig.{name} must be an int >= 1, got {value!r}")
        entries = self.verdict_cache_entries
        if isinstance(entries, bool) or not isinstance(entries, int) or entries < 0:
            raise ValueError(f"MathVerifierConfig.verdict_cache_entries must be an int >= 0 (0: off), got {entries!r}")
        if self.parallel_workers > MAX_PARALLEL_WORKERS:
            raise ValueError(f"MathVerifierConfig.parallel_workers must be <= {MAX_PARALLEL_WORKERS}, "
                             f"got {self.parallel_workers!r}")
        if not isinstance(self.numeric_fast_path, bool):
            raise ValueError(f"MathVerifierConfig.numeric_fast_path must be a bool, got {self.numeric_fast_path!r}")
        if not isinstance(self.sandbox, SandboxLimits):
            raise ValueError(f"MathVerifierConfig.sandbox must be a SandboxLimits, got {self.sandbox!r}")


def precheck_response(response: object, config: MathVerifierConfig) -> str | None:
    """Why a raw response is refused before any parsing, or None. Linear in the (capped) length."""
    if not isinstance(response, str):
        return f"response is a {type(response).__name__}, not text"
    if len(response) > config.max_response_chars:
        return f"response of {len(response)} chars exceeds {config.max_response_chars}"
    if "\x00" in response:
        return "response contains a NUL character"
    try:
        response.encode("utf-8")
    except UnicodeEncodeError:
        return "response is not valid Unicode (lone surrogate)"
    return None


# ----------------------------------------------------------------------------- caller side

class MathVerifier:
    """Scores responses against gold answers; hostile input gives reward 0 with a reason, never an exception.

    Thread-safe. The first sandboxed worker starts on the first item that needs math-verify, more
    (up to `parallel_workers`) only while every started one is busy; all are killed by `close()`,
    by `with`, or at interpreter exit. Its verdicts are cached (module
    docstring); `worker_calls` counts requests actually sent, `cache_hits` the items that needed
    one but were answered without it."""

    def __init__(self, config: MathVerifierConfig | None = None) -> None:
        self.config = config if config is not None else MathVerifierConfig()
        self._worker = SandboxedWorker(WORKER_FACTORY, self.config.sandbox)  # the first; more on demand
        self._workers = [self._worker]
        self._idle = [self._worker]
        self._pool = threading.Condition()
        self._inflight: dict[WorkerKey, _Pending] = {}  # requests being sent now, by key
        self._closed = False
        self._cache = VerdictCache(self.config.verdict_cache_entries)
        self._asker_pool: ThreadPoolExecutor | None = None  # verify_concurrently's helper threads
        self.worker_calls = 0  # requests sent to the sandboxed workers
        self.cache_hits = 0  # items for the worker answered without a request (cache, or a repeat in verify_many)

    def verify(self, gold: str, response: str) -> Verdict:
        screened = self._screen(gold, response)
        if isinstance(screened, Verdict):
            return screened
        cached = self._cache.get(screened)
        if cached is not None:
            with self._pool:
                self.cache_hits += 1
            return cached
        return self._verify_in_sandbox(screened)

    def verify_many(self, pairs: Iterable[tuple[str, str]]) -> list[Verdict]:
        """`verify` over (gold, response) pairs, in order, one request at a time.

        Each distinct (gold, answer) the cache does not hold goes to the worker once per call, in
        first-seen order; its repeats in the call share that verdict, an abort included (the next
        call retries it). A bad gold answer raises before any item is sent."""
        screened = [self._screen(gold, response) for gold, response in pairs]
        decided: dict[WorkerKey, Verdict] = {}
        verdicts: list[Verdict] = []
        for item in screened:
            if isinstance(item, Verdict):
                verdicts.append(item)
                continue
            verdict = decided.get(item)
            if verdict is None:
                verdict = self._cache.get(item)
            if verdict is None:
                verdict = decided[item] = self._verify_in_sandbox(item)
            else:
                self.cache_hits += 1
            verdicts.append(verdict)
        return verdicts

    def verify_concurrently(self, pairs: Sequence[tuple[str, str]]) -> list[Verdict]:
        """`verify` of each (gold, response) pair, in order, with the worker requests running while
        the rest is screened: the calling thread screens every pair in process, and hands each
        request that needs math-verify, the moment it finds one, to a helper thread (at most
        `parallel_workers` of them, one per worker) that asks a worker. So a batch costs about
        max(screening, requests / workers) instead of their sum (bench/coordinator_scale.py's reward
        phase). The verdicts are `verify`'s; a request repeated in the call is sent once, and a
        bad gold answer raises before anything is sent, as in `verify_many`."""
        return self.start_concurrently(pairs)()

    def start_concurrently(
        self, pairs: Sequence[tuple[str, str]], budget_s: float | None = None,
    ) -> Callable[[], list[Verdict]]:
        """`verify_concurrently` in two halves: this call screens every pair and sends the requests
        that need math-verify; the function it returns waits for their verdicts and gives the list.
        Between the two the caller may do other work while the workers decide (the coordinator
        decodes and checks the next lab's submission: `hacfed.server.replies`).

        budget_s: the most seconds of worker requests the batch may use (`verify_budget`); once
        spent its requests not yet sent are not sent, and the function returned raises
        `VerifyBudgetSpent` instead of giving verdicts."""
        budget = VerifyBudget(budget_s)
        for gold, _ in pairs:
            _check_gold(gold)
        askers: ThreadPoolExecutor | None = None  # taken at the first request only
        sent: dict[WorkerKey, Future[Verdict]] = {}
        out: list[Verdict | Future[Verdict]] = []
        for gold, response in pairs:
            item = self._screen(gold, response)
            if isinstance(item, Verdict):
                out.append(item)
                continue
            answer: Verdict | Future[Verdict] | None = sent.get(item)
            if answer is None:
                answer = self._cache.get(item)
                if answer is None:
                    askers = askers or self._askers()
                    answer = sent[item] = askers.submit(self._verify_within, item, budget)
                    out.append(answer)
                    continue
            with self._pool:
                self.cache_hits += 1
            out.append(answer)

        def verdicts() -> list[Verdict]:
            done = [v if isinstance(v, Verdict) else v.result() for v in out]
            budget.check()
            return done

        return verdicts

    def _verify_within(self, key: WorkerKey, budget: VerifyBudget) -> Verdict:
        """`_verify_in_sandbox` with its request's time charged to `budget` (not a worker's start,
        nor waiting for another caller's request); nothing sent once the budget is spent."""
        if budget.seconds is None:
            return self._verify_in_sandbox(key)
        if budget.exhausted:
            return _abort("the batch's verification budget is spent")
        return self._verify_in_sandbox(key, budget)

    def _askers(self) -> ThreadPoolExecutor:
        """The helper threads of `verify_concurrently`, one per possible worker, started on first use."""
        with self._pool:
            if self._closed:
                raise RuntimeError("MathVerifier is closed")
            if self._asker_pool is None:
                self._asker_pool = ThreadPoolExecutor(self.config.parallel_workers,
                                                      thread_name_prefix="hacfed-verifier")
            return self._asker_pool

    @property
    def cached_verdicts(self) -> int:
        """Entries in the verdict cache now (at most `config.verdict_cache_entries`)."""
        return len(self._cache)

    @property
    def network_isolated(self) -> bool:
        """Whether the worker has no network but loopback (starts it if needed)."""
        return self._worker.network_isolated

    @property
    def worker_starts(self) -> int:
        return sum(w.starts for w in self._workers)

    @property
    def worker_pids(self) -> tuple[int, ...]:
        """The live workers' process ids (for measuring their CPU, bench/coordinator_scale.py)."""
        return tuple(pid for w in list(self._workers) if (pid := w.pid) is not None)

    def close(self) -> None:
        with self._pool:
            self._closed = True
            workers = list(self._workers)
            askers, self._asker_pool = self._asker_pool, None
            self._pool.notify_all()
        if askers is not None:
            askers.shutdown(wait=False, cancel_futures=True)
        for w in workers:
            w.close()

    def __enter__(self) -> "MathVerifier":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _screen(self, gold: str, response: str) -> Verdict | WorkerKey:
        """Steps 1-4 in process: the final Verdict, or the (gold, answer) request the worker must decide."""
        _check_gold(gold)
        refusal = precheck_response(response, self.config)
        if refusal is not None:
            return _abort(f"refused: {refusal}")
        extracted = extract_answer(response, self.config.answer_mode)
        if extracted is None:
            what = "\\boxed{} answer" if self.config.answer_mode == "boxed" else "final answer"
            return Verdict(0.0, f"no {what} found")
        answer = extracted.strip()
        if not answer:
            return Verdict(0.0, "empty answer")
        if len(answer) > self.config.max_answer_chars:
            return _abort(f"refused: answer of {len(answer)} chars exceeds {self.config.max_answer_chars}")
        depth = nesting_depth(answer)
        if depth > self.config.max_nesting:
            return _abort(f"refused: answer nests brackets {depth} deep (max {self.config.max_nesting})")
        if self.config.numeric_fast_path:
            gold_number, answer_number = plain_gold(gold), plain_answer(answer)
            if answer_number is None and answer.startswith(DOLLAR):
                answer_number = dollar_amount(answer)
            if gold_number is not None and answer_number is not None:
                return Verdict(1.0, "numeric match") if gold_number == answer_number else Verdict(0.0, "wrong answer")
        cfg = self.config
        too_big = size_refusal(answer, cfg.max_exponent, cfg.max_factorial, cfg.max_integer_digits,
                               cfg.max_value_digits)
        if too_big is not None:
            return _abort(f"refused: answer holds {too_big}")
        return gold.strip(), answer

    def _verify_in_sandbox(self, key: WorkerKey, budget: VerifyBudget | None = None) -> Verdict:
        """Ask a worker; cache its verdict unless the request aborted (those may be transient). A
        key another thread is asking about right now gets that thread's verdict (an abort too)."""
        with self._pool:
            pending = self._inflight.get(key)
            mine = pending is None
            if mine:
                pending = self._inflight[key] = _Pending()
        if not mine:
            pending.done.wait()
            with self._pool:
                self.cache_hits += 1
            return pending.verdict
        try:
            pending.verdict = self._ask_worker(key) if budget is None else self._ask_worker(key, budget)
            return pending.verdict
        finally:
            with self._pool:
                del self._inflight[key]
            pending.done.set()

    def _ask_worker(self, key: WorkerKey, budget: VerifyBudget | None = None) -> Verdict:
        gold, answer = key
        worker = self._checkout()
        try:
            with self._pool:
                self.worker_calls += 1
            try:
                if budget is not None:
                    worker.start()
                started = time.monotonic()
                try:
                    result = worker.call({"gold": gold, "answer": answer})
                finally:
                    if budget is not None:
                        budget.charge(time.monotonic() - started)
            except SandboxAbort as e:
                return _abort(e.reason)
        finally:
            self._checkin(worker)
        if result.get("equal") is True:
            verdict = Verdict(1.0, "equivalent (math-verify)")
        else:
            note = result.get("note")
            verdict = Verdict(0.0, "wrong answer" if note is None else str(note)[:100])
        self._cache.put(key, verdict)
        return verdict

    def _checkout(self) -> SandboxedWorker:
        """An idle worker; a new one while fewer than `parallel_workers` exist; else wait for one."""
        with self._pool:
            while True:
                if self._closed:
                    raise RuntimeError("MathVerifier is closed")
                if self._idle:
                    return self._idle.pop()
                if len(self._workers) < self.config.parallel_workers:
                    worker = SandboxedWorker(WORKER_FACTORY, self.config.sandbox)
                    self._workers.append(worker)
                    return worker
                self._pool.wait()

    def _checkin(self, worker: SandboxedWorker) -> None:
        with self._pool:
            self._idle.append(worker)
            self._pool.notify()


def _check_gold(gold: object) -> None:
    if not isinstance(gold, str) or not gold.strip():
        raise ValueError(f"MathVerifier.verify needs a non-empty gold answer string, got {gold!r}")


class _Pending:
    """A request one thread is sending; the others asking for the same key wait for `done`."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.verdict = _abort("worker error")  # replaced before `done` is set, unless the call raised


def _abort(reason: str) -> Verdict:
    return Verdict(0.0, f"{VERIFIER_ABORT}: {reason}")
