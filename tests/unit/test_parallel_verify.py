"""Reward re-verification over several threads and math-verify workers gives the verdicts of one
thread and one worker (issue 11: both cores verify; bench/coordinator_scale.py measures it)."""

from __future__ import annotations

import dataclasses
import threading
from typing import Iterator

import pytest

from hacfed.server.coordinator import reward_verification, validation
from hacfed.server.coordinator.validation import ValidationLimits, validate_submission
from hacfed.tasks.base import Verdict
from hacfed.tasks.math_verifier import MathVerifier, MathVerifierConfig
from tests.unit.test_coordinator_fakes import TASK, make_coordinator, scripted_submission, scripted_trajectories


class ThreadRecordingTask:
    """The arithmetic task, recording which threads verified (and optionally failing on one text)."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.name = TASK.name
        self.threads: set[int] = set()
        self.fail_on = fail_on
        self._lock = threading.Lock()

    def problem(self, prompt_id: str):
        return TASK.problem(prompt_id)

    def verify(self, problem, response: str) -> Verdict:
        with self._lock:
            self.threads.add(threading.get_ident())
        if response == self.fail_on:
            return Verdict(7.0, "out of range")  # `_verified_reward` refuses it
        return TASK.verify(problem, response)


def _judged(tmp_path, threads: int, task, prompts: int = 40, falsify: int = 3):
    coord = make_coordinator(tmp_path, prompts_per_round=prompts, group_size=4, expected_participants=1)
    coord.register("a")
    plan = coord.open_round(0)
    sub = scripted_submission(plan, "a", falsify=falsify)
    limits = ValidationLimits(group_size=4, max_new_tokens=8, max_response_chars=1000, min_mean_logp=-50.0,
                              verify_threads=threads)
    return sub, validate_submission(sub, plan, task, limits)


def test_two_threads_judge_exactly_as_one_and_both_verify(tmp_path) -> None:
    one_task, two_task = ThreadRecordingTask(), ThreadRecordingTask()
    _, one = _judged(tmp_path / "one", 1, one_task)
    _, two = _judged(tmp_path / "two", 2, two_task)
    assert two == one
    assert len(one.accepted) == 39 * 4 and len(one.strikes) == 3  # three falsified claims in one group
    assert len(one_task.threads) == 1 and len(two_task.threads) == 2


def test_small_submissions_stay_in_the_calling_thread(tmp_path) -> None:
    task = ThreadRecordingTask()
    _judged(tmp_path, 4, task, prompts=8)  # 32 samples < 2 x MIN_SAMPLES_PER_THREAD
    assert task.threads == {threading.get_ident()}


def test_a_verifier_error_in_a_helper_thread_reaches_the_caller(tmp_path) -> None:
    coord = make_coordinator(tmp_path, prompts_per_round=40, group_size=4, expected_participants=1)
    plan = coord.open_round(0)
    samples = scripted_trajectories(plan, "a")
    samples[-1] = dataclasses.replace(samples[-1], response_text="only this one")  # the second thread's slice
    task = ThreadRecordingTask(fail_on="only this one")
    limits = ValidationLimits(group_size=4, max_new_tokens=8, max_response_chars=1000, min_mean_logp=-50.0,
                              verify_threads=2)
    with pytest.raises(ValueError, match="outside \\[0, 1\\]"):
        validate_submission(scripted_submission(plan, "a", trajectories=samples), plan, task, limits)
    assert len(task.threads) == 2


class BatchTask(ThreadRecordingTask):
    """ThreadRecordingTask with `start_verify_batch`: records each batch, verifies item by item."""

    def __init__(self, drop_one: bool = False) -> None:
        super().__init__()
        self.batches: list[int] = []
        self.drop_one = drop_one

    def start_verify_batch(self, items):
        self.batches.append(len(items))
        verdicts = [self.verify(problem, response) for problem, response in items]
        return lambda: verdicts[:-1] if self.drop_one else verdicts


def test_a_task_with_start_verify_batch_gets_the_whole_batch_and_the_same_outcome(tmp_path) -> None:
    one_task, batch_task, single_task = ThreadRecordingTask(), BatchTask(), BatchTask()
    _, one = _judged(tmp_path / "one", 1, one_task)
    _, batched = _judged(tmp_path / "batched", 2, batch_task)
    _, single = _judged(tmp_path / "single", 1, single_task)
    assert batched == one == single and len(one.strikes) == 3
    assert batch_task.batches == [40 * 4]  # every sample of the groups that passed, in one call
    assert single_task.batches == []  # one thread: item by item, as before


def test_a_batch_with_a_missing_verdict_is_an_error(tmp_path) -> None:
    with pytest.raises(ValueError, match="start_verify_batch gave 159 verdicts for 160 samples"):
        _judged(tmp_path, 2, BatchTask(drop_one=True))


def test_the_coordinator_passes_its_verify_threads(tmp_path, monkeypatch) -> None:
    seen = []
    original = reward_verification.verified_rewards
    monkeypatch.setattr(reward_verification, "verified_rewards", lambda task, items, threads, *budget:
                        seen.append(threads) or original(task, items, threads, *budget))
    coord = make_coordinator(tmp_path, verify_threads=3, expected_participants=1)
    coord.register("a")
    coord.submit(scripted_submission(coord.open_round(0), "a"))
    assert seen == [3]


@pytest.mark.parametrize("bad", [0, 9, True, 1.5, "2", None])
def test_verify_threads_refuses_bad_values_naming_them(tmp_path, bad) -> None:
    with pytest.raises(ValueError, match=f"verify_threads must be an integer.*got {bad!r}"):
        make_coordinator(tmp_path, verify_threads=bad)


# ---- the math-verify worker pool ----------------------------------------------------------------

# Items only the worker decides, each distinct: (gold, response).
WORKER_PAIRS = [(str(n), f"\\boxed{{{n + (n % 3 == 0)}\\text{{ dollars}}}}") for n in range(10, 34)]


@pytest.fixture
def pooled() -> Iterator[MathVerifier]:
    with MathVerifier(MathVerifierConfig(verdict_cache_entries=0, parallel_workers=2)) as v:
        yield v


def _from_threads(verifier: MathVerifier, pairs, threads: int = 2) -> list[Verdict]:
    out: list[Verdict | None] = [None] * len(pairs)
    barrier = threading.Barrier(threads)

    def run(k: int) -> None:
        barrier.wait()
        for i in range(k, len(pairs), threads):
            out[i] = verifier.verify(*pairs[i])

    workers = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return out  # type: ignore[return-value]


def test_concurrent_callers_use_a_second_worker_and_get_the_same_verdicts(pooled: MathVerifier) -> None:
    parallel = _from_threads(pooled, WORKER_PAIRS)
    assert pooled.worker_starts == 2 and len(pooled.worker_pids) == 2
    with MathVerifier(MathVerifierConfig(verdict_cache_entries=0, parallel_workers=1)) as single:
        assert parallel == [single.verify(g, r) for g, r in WORKER_PAIRS]
        assert single.worker_starts == 1
    assert {v.reward for v in parallel} == {0.0, 1.0}


def test_one_caller_at_a_time_never_starts_a_second_worker(pooled: MathVerifier) -> None:
    for gold, response in WORKER_PAIRS[:4]:
        pooled.verify(gold, response)
    assert pooled.worker_starts == 1 and pooled.worker_calls == 4


def test_the_same_request_from_two_threads_is_sent_once(monkeypatch) -> None:
    import hacfed.tasks.math_verifier as mv

    verifier = MathVerifier(MathVerifierConfig(verdict_cache_entries=0))
    asked, waiting, release = [], threading.Semaphore(0), threading.Event()

    class Watched(threading.Event):
        def wait(self, timeout=None):  # a second caller waits for the first one's verdict
            waiting.release()
            return super().wait(timeout)

    class Pending(mv._Pending):
        def __init__(self) -> None:
            super().__init__()
            self.done = Watched()

    def slow_worker(key):
        asked.append(key)
        assert release.wait(10)
        return Verdict(1.0, "equivalent (math-verify)")

    monkeypatch.setattr(mv, "_Pending", Pending)
    monkeypatch.setattr(verifier, "_ask_worker", slow_worker)
    out: list[Verdict] = []
    callers = [threading.Thread(target=lambda text=text: out.append(verifier.verify("72", text)))
               for text in ("\\boxed{72\\text{ dollars}}", "so \\boxed{72\\text{ dollars}}")]  # one request
    for c in callers:
        c.start()
    assert waiting.acquire(timeout=10)  # one caller asks, the other waits for it
    release.set()
    for c in callers:
        c.join()
    assert asked == [("72", "72\\text{ dollars}")] and out == [Verdict(1.0, "equivalent (math-verify)")] * 2
    assert verifier.cache_hits == 1 and verifier.worker_starts == 0  # nothing reached a real worker


def test_a_closed_verifier_refuses_work(pooled: MathVerifier) -> None:
    pooled.close()
    with pytest.raises(RuntimeError, match="closed"):
        pooled.verify("72", "\\boxed{72\\text{ dollars}}")


@pytest.mark.parametrize("bad", [0, 9, True, 2.0, None])
def test_parallel_workers_refuses_bad_values_naming_them(bad) -> None:
    with pytest.raises(ValueError, match=f"parallel_workers must be .*got {bad!r}"):
        MathVerifierConfig(parallel_workers=bad)


# ---- the numeric fast path's shortcuts decide exactly as the Decimal comparison ------------------

from decimal import Decimal  # noqa: E402

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from hacfed.tasks.math_answers import parse_plain_number, plain_answer  # noqa: E402

GOLDS = ["72", "72.0", "0", "-5", "1,000", "0.5", "007", "1000000000000000000000000000001"]


def _reference(gold: str, answer: str) -> Verdict | None:
    g, a = parse_plain_number(gold), parse_plain_number(answer)
    if g is None or a is None:
        return None
    return Verdict(1.0, "numeric match") if g == a else Verdict(0.0, "wrong answer")


@settings(max_examples=300, deadline=None)
@given(gold=st.sampled_from(GOLDS), answer=st.one_of(
    st.from_regex(r"\A[0-9]{1,40}\Z"),
    st.sampled_from(["72", "072", "0072", "1000", "1,000", "5", "-5", "0.50", "٧٢"])))
def test_the_fast_path_gives_the_decimal_verdict(gold: str, answer: str) -> None:
    verifier = MathVerifier(MathVerifierConfig())
    expected = _reference(gold, answer)
    got = verifier._screen(gold, f"so \\boxed{{{answer}}}")
    if expected is not None:
        assert got == expected
    else:
        assert not (isinstance(got, Verdict) and got.reason == "numeric match")
    assert verifier.worker_starts == 0
    parsed = plain_answer(answer)
    assert (parsed is None) == (parse_plain_number(answer) is None)
    if parsed is not None:
        assert parsed == parse_plain_number(answer) and Decimal(parsed) == parse_plain_number(answer)


def test_repeated_prompt_and_source_ids_are_checked_once_and_bad_ones_still_refused(tmp_path, monkeypatch) -> None:
    calls: list[object] = []
    original = validation.is_short_id
    monkeypatch.setattr(validation, "is_short_id", lambda v: calls.append(v) or original(v))
    sub, outcome = _judged(tmp_path / "ok", 1, ThreadRecordingTask(), prompts=5, falsify=0)
    ids = [t.trajectory_id for t in sub.trajectories]
    expected = ids + [t.prompt_id for t in sub.trajectories[::4]] + ["a", "loss"]  # + the report metric name
    assert sorted(map(str, calls)) == sorted(expected)
    assert len(outcome.accepted) == 20
    coord = make_coordinator(tmp_path / "bad", prompts_per_round=5, group_size=4, expected_participants=1)
    plan = coord.open_round(0)
    samples = scripted_trajectories(plan, "a")
    samples[5] = dataclasses.replace(samples[5], source_id="a\n")  # not printable: refused even after good ones
    limits = ValidationLimits(group_size=4, max_new_tokens=8, max_response_chars=1000, min_mean_logp=-50.0)
    refused = validate_submission(scripted_submission(plan, "a", trajectories=samples), plan, TASK, limits)
    assert [r.code.value for r in refused.rejections if r.trajectory_id == samples[5].trajectory_id] == \
        ["HACFED-E-SCHEMA"]


# ---- a dollar amount takes the fast path, with math-verify's own verdict -------------------------

DOLLAR_GOLDS = ["72", "1080", "72.5", "-3", "0.25", "0.5", "1000000", "0", "3"]
DOLLAR_NUMBERS = ["72", "1,080", "1080", "72.5", "72.50", "-3", "0.25", ".5", "1,000,000", "0", "3.0", "71"]


@pytest.fixture(scope="module")
def math_verify_handler():
    """math-verify's request handler, as the sandboxed worker runs it, here in process."""
    from hacfed.tasks.math_worker import worker_handler

    return worker_handler()


@pytest.mark.parametrize("form", ["\\${}", "\\$ {}"])
def test_a_dollar_amount_is_decided_in_process_as_math_verify_decides_it(form, math_verify_handler) -> None:
    verifier = MathVerifier(MathVerifierConfig())
    for gold in DOLLAR_GOLDS:
        for number in DOLLAR_NUMBERS:
            answer = form.format(number)
            got = verifier._screen(gold, f"So the total is \\boxed{{{answer}}}.")
            assert isinstance(got, Verdict), (gold, answer, got)  # decided without the worker
            assert got == verifier._screen(gold, f"\\boxed{{{number}}}"), (gold, answer)  # as the bare number
            equal = math_verify_handler({"gold": gold, "answer": answer})["equal"]
            assert got.reward == (1.0 if equal else 0.0), (gold, answer, got, equal)
    assert verifier.worker_starts == 0


@pytest.mark.parametrize("answer", [
    "\\$  72", "\\$\t72", "\\$", "\\$\\$72", "\\$72\\text{ units}", "\\$72\\%", "$72", "72\\$", "-\\$72", "\\$(72)",
    "\\$٧٢", "\\$\u00a072",  # other scripts' digits (math-verify: not 72), a no-break space
])
def test_other_dollar_forms_still_go_to_math_verify(answer) -> None:
    verifier = MathVerifier(MathVerifierConfig())
    assert not isinstance(verifier._screen("72", f"\\boxed{{{answer}}}"), Verdict), answer


def test_a_hostile_dollar_amount_is_refused_by_the_answer_cap_before_any_parse() -> None:
    verifier = MathVerifier(MathVerifierConfig())
    got = verifier._screen("72", "\\boxed{\\$" + "9" * 5000 + "}")
    assert isinstance(got, Verdict) and got.reward == 0.0 and "exceeds 200" in got.reason
    grouped = "\\$1" + ",000" * 49  # 199 chars, within the cap: a plain grouped number, decided in process
    assert verifier._screen("72", f"\\boxed{{{grouped}}}") == Verdict(0.0, "wrong answer")
    assert verifier.worker_starts == 0
