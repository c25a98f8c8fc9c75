"""MathVerifier's verdict cache and verify_many's de-duplication, over the real worker and math-verify."""

from __future__ import annotations

import threading
from typing import Iterator

import pytest

from hacfed.tasks.base import Verdict
from hacfed.tasks.math_verifier import MathVerifier, MathVerifierConfig, VerdictCache
from hacfed.tasks.sandbox import VERIFIER_ABORT, SandboxLimits

ABORT = f"{VERIFIER_ABORT}: "
TOWER = "\\boxed{9^{9^{9}}}"  # evaluating it needs ~10^8 digits: the worker times out

# (gold, response): numeric fast path, math-verify equivalents and non-equivalents, in-process refusals.
MIXED = [
    ("72", "She sold \\boxed{72} clips."),
    ("72", "So the answer is \\boxed{72\\text{ dollars}}."),
    ("72", "\\boxed{72\\text{ units}}"),
    ("72", "\\boxed{72\\%}"),
    ("0.5", "\\boxed{\\frac{1}{2}}"),
    ("0.5", "\\boxed{\\frac{1}{3}}"),
    ("72", "\\boxed{71\\text{ dollars}}"),
    ("18", "\\boxed{72\\text{ dollars}}"),  # same answer as above, other gold: another key, another verdict
    ("72", "\\boxed{\\frac{\\frac{\\frac{}{}}{}}{\\left(\\right.}}"),
    ("72", "no box here"),
    ("72", "\\boxed{71}"),
    ("x^2+2x+1", "\\boxed{(x+1)^2}"),
]
WORKER_ITEMS = 9  # items of MIXED the numeric fast path and the pre-checks cannot decide


@pytest.fixture(scope="module")
def uncached() -> Iterator[MathVerifier]:
    with MathVerifier(MathVerifierConfig(verdict_cache_entries=0)) as v:
        yield v


@pytest.fixture
def cached() -> Iterator[MathVerifier]:
    with MathVerifier() as v:
        yield v


# ----------------------------------------------------------------------------- the LRU itself (pure)


def test_lru_evicts_the_least_recently_used_and_never_exceeds_its_bound() -> None:
    cache = VerdictCache(2)
    one, two, three = Verdict(1.0, "one"), Verdict(0.0, "two"), Verdict(1.0, "three")
    cache.put(("1", "a"), one)
    cache.put(("2", "b"), two)
    assert cache.get(("1", "a")) is one  # refreshes ("1", "a")
    cache.put(("3", "c"), three)
    assert len(cache) == 2
    assert cache.get(("2", "b")) is None  # the least recently used went
    assert cache.get(("1", "a")) is one and cache.get(("3", "c")) is three
    off = VerdictCache(0)
    off.put(("1", "a"), one)
    assert len(off) == 0 and off.get(("1", "a")) is None


@pytest.mark.parametrize("bad", [-1, 1.5, "100", True, None])
def test_config_validation_names_the_bad_value(bad: object) -> None:
    with pytest.raises(ValueError, match=rf"verdict_cache_entries must be an int >= 0 .*got {bad!r}"):
        MathVerifierConfig(verdict_cache_entries=bad)  # type: ignore[arg-type]
    assert MathVerifierConfig(verdict_cache_entries=0).verdict_cache_entries == 0


# ----------------------------------------------------------------------------- through the worker


def test_repeated_pairs_go_to_the_worker_once(cached: MathVerifier) -> None:
    first = cached.verify("72", "So the answer is \\boxed{72\\text{ dollars}}.")
    assert first == Verdict(1.0, "equivalent (math-verify)") and cached.worker_calls == 1
    # Other text, same extracted answer: the same request, so a cache hit.
    for response in ("\\boxed{72\\text{ dollars}}", "Therefore \\boxed{ 72\\text{ dollars} }.",
                     "Let me see. \\boxed{72\\text{ dollars}}"):
        assert cached.verify(" 72 ", response) == first
    assert (cached.worker_calls, cached.cache_hits, cached.cached_verdicts) == (1, 3, 1)
    # The gold is part of the key: a cached 1.0 for ("72", "\$72") is no 1.0 for gold 73.
    assert cached.verify("73", "\\boxed{72\\text{ dollars}}") == Verdict(0.0, "wrong answer")
    assert cached.worker_calls == 2


def test_verify_many_sends_each_distinct_miss_once(cached: MathVerifier) -> None:
    pairs = [("72", "\\boxed{72\\text{ dollars}}"), ("72", "\\boxed{72\\%}"), ("72", "x \\boxed{72\\text{ dollars}}"),
             ("72", "\\boxed{72}")] * 5
    verdicts = cached.verify_many(pairs)
    assert cached.worker_calls == 2  # \$72 and 72\%; the plain 72 never needs the worker
    equivalent, numeric = Verdict(1.0, "equivalent (math-verify)"), Verdict(1.0, "numeric match")
    assert verdicts == [equivalent, equivalent, equivalent, numeric] * 5
    assert cached.verify_many(pairs) == verdicts and cached.worker_calls == 2  # all from the cache now


def test_cached_verdicts_equal_uncached_ones(uncached: MathVerifier, cached: MathVerifier) -> None:
    before = uncached.worker_calls
    reference = [uncached.verify(gold, response) for gold, response in MIXED * 2]
    assert uncached.worker_calls - before == 2 * WORKER_ITEMS  # no cache: every item is a request
    assert uncached.cached_verdicts == 0
    rewards = [v.reward for v in reference[: len(MIXED)]]
    assert rewards == [1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    many = cached.verify_many(MIXED * 2)
    assert many == reference and cached.worker_calls == WORKER_ITEMS
    one_by_one = [cached.verify(gold, response) for gold, response in MIXED]
    assert one_by_one == reference[: len(MIXED)] and cached.worker_calls == WORKER_ITEMS


def test_verify_many_dedupes_within_a_call_even_without_the_cache(uncached: MathVerifier) -> None:
    before = uncached.worker_calls
    assert uncached.verify_many(MIXED * 3) == [uncached.verify(gold, response) for gold, response in MIXED] * 3
    assert uncached.worker_calls - before == 2 * WORKER_ITEMS  # once in the call, once by the loop
    assert uncached.cached_verdicts == 0


def test_the_bound_holds_and_evicted_pairs_are_asked_again() -> None:
    with MathVerifier(MathVerifierConfig(verdict_cache_entries=3)) as verifier:
        for n in range(1, 7):
            assert verifier.verify(str(n), f"\\boxed{{{n}\\text{{ dollars}}}}").reward == 1.0
            assert verifier.cached_verdicts == min(n, 3)
        assert verifier.worker_calls == 6
        assert verifier.verify("6", "\\boxed{6\\text{ dollars}}").reward == 1.0 and verifier.worker_calls == 6  # kept
        assert verifier.verify("1", "\\boxed{1\\text{ dollars}}").reward == 1.0
        assert verifier.worker_calls == 7  # evicted
        assert verifier.cached_verdicts == 3


def test_aborts_are_never_cached() -> None:
    # 1 s per item keeps the timeout fast; the size screen opened wide lets the tower reach the worker.
    wide = MathVerifierConfig(sandbox=SandboxLimits(timeout_s=1.0), max_exponent=10**12, max_value_digits=10**12)
    with MathVerifier(wide) as verifier:
        first = verifier.verify("72", TOWER)
        assert first == Verdict(0.0, ABORT + "timeout") and verifier.cached_verdicts == 0
        again = verifier.verify_many([("72", TOWER), ("72", "then " + TOWER), ("72", "\\boxed{72\\text{ dollars}}")])
        # retried (not served from the cache), but once for both copies in the one call
        assert verifier.worker_calls == 3 and verifier.cache_hits == 1
        assert again[:2] == [first, first] and again[2].reward == 1.0
        assert verifier.cached_verdicts == 1  # only the honest verdict
        verifier.verify("72", TOWER)
        assert verifier.worker_calls == 4


def test_a_bad_gold_raises_before_anything_is_sent(cached: MathVerifier) -> None:
    with pytest.raises(ValueError, match="non-empty gold answer"):
        cached.verify_many([("72", "\\boxed{72\\text{ dollars}}"), ("", "\\boxed{1}")])
    assert cached.worker_calls == 0


# ----------------------------------------------------------------------------- verify_concurrently


def test_verify_concurrently_gives_verify_s_verdicts_and_sends_each_miss_once(
    uncached: MathVerifier, cached: MathVerifier,
) -> None:
    reference = [uncached.verify(gold, response) for gold, response in MIXED]
    assert cached.verify_concurrently(MIXED * 3) == reference * 3
    assert cached.worker_calls == WORKER_ITEMS and cached.cache_hits == 2 * WORKER_ITEMS  # repeats wait for the first
    assert cached.verify_concurrently(MIXED) == reference and cached.worker_calls == WORKER_ITEMS  # from the cache


def test_verify_concurrently_asks_from_helper_threads_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # Two requests must be in flight together (the barrier needs both), from the helper threads,
    # while the calling thread screens: a verifier that asked one at a time would break the barrier.
    verifier = MathVerifier(MathVerifierConfig(verdict_cache_entries=0))
    barrier, askers = threading.Barrier(2, timeout=10), []

    def ask(key):
        askers.append(threading.current_thread().name)
        barrier.wait()
        return Verdict(1.0, "equivalent (math-verify)")

    monkeypatch.setattr(verifier, "_ask_worker", ask)
    pairs = [("72", "\\boxed{72\\text{ dollars}}"), ("5", "\\boxed{5}"), ("18", "\\boxed{18\\%}")]
    try:
        assert verifier.verify_concurrently(pairs) == [
            Verdict(1.0, "equivalent (math-verify)"), Verdict(1.0, "numeric match"),
            Verdict(1.0, "equivalent (math-verify)")]
    finally:
        verifier.close()
    assert len(askers) == 2 and all(name.startswith("hacfed-verifier") for name in askers)
    assert verifier.worker_starts == 0


def test_verify_concurrently_checks_every_gold_first_and_refuses_once_closed(cached: MathVerifier) -> None:
    with pytest.raises(ValueError, match="non-empty gold answer"):
        cached.verify_concurrently([("72", "\\boxed{72\\text{ dollars}}"), ("", "\\boxed{1}")])
    assert cached.worker_calls == 0
    cached.close()
    with pytest.raises(RuntimeError, match="closed"):
        cached.verify_concurrently([("72", "\\boxed{72\\text{ dollars}}")])
