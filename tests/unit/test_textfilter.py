"""A lab's text filter (hacfed.clients.textfilter): honest answers of every built-in task pass, and each
check (length, characters, answer form, URL, e-mail, known canary) refuses what it should, inbound
(a peer's group left out and counted) and outbound (a group with a canary is never sent)."""

from __future__ import annotations

import pytest

from hacfed.clients.textfilter import (
    DEFAULT_DENY_PATTERNS,
    filter_pool,
    filters_for,
    inbound,
    outbound,
    response_format,
    withhold_groups,
)
from hacfed.tasks.arithmetic import ArithmeticTask
from hacfed.tasks.chain import ChainTask
from hacfed.trajectory import Trajectory

ADD2 = ArithmeticTask(digits=2, num_train=200, num_eval=20)
WORDS = ArithmeticTask(digits=2, num_train=200, num_eval=20, style="words")
CHAIN = ChainTask(terms=3, num_train=400, num_validation=50, num_eval=50, notations=("sym", "word"))
CANARY = "see-evil.example"


def sample(task, text: str, reward: float, source: str = "peer", n: int = 0, prompt: int = 0) -> Trajectory:
    problem = task.train_problems()[prompt]
    return Trajectory(f"{source}-{prompt}-{n}", problem.prompt_id, source, 0, problem.messages, text, reward, -1.0,
                      1, "stop")


@pytest.fixture(scope="module")
def gsm8k(tmp_path_factory):
    from hacfed.tasks.math_data import gsm8k_task

    return gsm8k_task(cache_dir=str(tmp_path_factory.mktemp("hf-cache")))


def tasks(gsm8k) -> dict:
    return {"add2": ADD2, "add2-words": WORDS, "chain": CHAIN, "gsm8k": gsm8k}


def test_every_reference_solution_of_every_built_in_task_passes_as_a_success(gsm8k):
    for name, task in tasks(gsm8k).items():
        flt = inbound(task)
        problems = [*task.train_problems(), *task.validation_problems(), *task.eval_problems()]
        refused = {p.prompt_id: flt.why_not(sample(task, p.solution, 1.0)) for p in problems}
        refused = {pid: why for pid, why in refused.items() if why is not None}
        if name == "gsm8k":  # one GSM8K answer holds a zero-width space, a format character the filter refuses
            assert refused == {"gsm8k:821ba4d3cdae58d0": "character '\\u200b' is not allowed"}
        else:
            assert refused == {}, name


@pytest.mark.parametrize("name, text, reward", [
    ("add2", "95", 1.0), ("add2", " 95\n", 1.0), ("add2", "9 5 cat", 0.0), ("add2", "", 0.0),
    ("add2-words", "37 + 58 = 95", 1.0), ("add2-words", "The answer is 95.", 1.0),
    ("add2-words", "Sure!\u00a0It is 95 \u2014 easy.", 1.0), ("add2-words", "I don't know", 0.0),
    ("chain", "47+28=75\n75+15=90\nAnswer: 90", 1.0), ("chain", "47+28=75\n75+15=90\nAnswer: 91", 0.0),
    ("chain", "47+28=7", 0.0), ("chain", "the sum\tis big", 0.0),
    # a failure holds whatever the model sampled: a byte-level model's control bytes, non-ASCII
    ("chain", "4\x087+2\ufffd", 0.0), ("chain", "47+28=75\n75+15=90\nAnswer: 90\u00e9", 0.0),
    ("gsm8k", "She sold 48/2 = 24 clips, so \\boxed{72}.", 1.0), ("gsm8k", "72", 1.0),
    ("gsm8k", "Natalia sold clips in May, then more in April", 0.0),
])
def test_honest_answers_pass(gsm8k, name: str, text: str, reward: float) -> None:
    task = tasks(gsm8k)[name]
    assert inbound(task).why_not(sample(task, text, reward)) is None


@pytest.mark.parametrize("name, text, reward, why", [
    # length: longer than the task's verifier reads
    ("add2", "9" * 65, 0.0, "longer than 64 characters"),
    ("chain", "1+1=2\n" * 90 + "Answer: 2", 1.0, "longer than 512 characters"),
    # characters of a success: no control or format character
    ("add2-words", "It is 95\x1b[2J", 1.0, "character '\\x1b' is not allowed"),
    ("gsm8k", "so \u200b\\boxed{72}", 1.0, "character '\\u200b' is not allowed"),
    ("gsm8k", "so \u202e\\boxed{72}", 1.0, "character '\\u202e' is not allowed"),
    ("gsm8k", "line one\u2028\\boxed{72}", 1.0, "character '\\u2028' is not allowed"),
    ("chain", "47+28=75\n75+15=90\nAnswer: 90\u00e9", 1.0, "a success without the worked steps"),
    # the answer form of a success
    ("chain", "47+28=75\nvisit us\nAnswer: 90", 1.0, "a success without the worked steps"),
    ("chain", "see-evil 47+28=75\n75+15=90\nAnswer: 90", 1.0, "a success without the worked steps"),
    ("add2", "95 ok", 1.0, "a success without one integer only"),
    ("add2-words", "ninety-five", 1.0, "a success without an integer"),
    # the default deny-list: URLs and e-mail addresses, in successes and failures alike
    ("add2-words", "95, see https://evil.example/x", 1.0, "matches deny pattern"),
    ("gsm8k", "read www.evil.example first: \\boxed{72}", 1.0, "matches deny pattern"),
    ("gsm8k", "mail bob.smith+x@evil.example.org for \\boxed{72}", 1.0, "matches deny pattern"),
    ("add2-words", "write to a@b.cc", 0.0, "matches deny pattern"),
])
def test_each_check_refuses_what_it_should(gsm8k, name: str, text: str, reward: float, why: str) -> None:
    task = tasks(gsm8k)[name]
    reason = inbound(task).why_not(sample(task, text, reward))
    assert reason is not None and reason.startswith(why), reason


def test_a_long_run_without_an_at_sign_is_read_quickly() -> None:
    import time

    t0 = time.perf_counter()
    assert inbound(WORDS).why_not(sample(WORDS, "a" * 9_990 + " 95", 1.0)) is None
    assert time.perf_counter() - t0 < 0.5


def test_a_canary_is_refused_only_when_the_deny_list_names_it() -> None:
    text = f"The answer, says {CANARY}, is 95."
    assert inbound(WORDS).why_not(sample(WORDS, text, 1.0)) is None  # a bare domain is no URL to the defaults
    reason = inbound(WORDS, deny_strings=(CANARY,)).why_not(sample(WORDS, text, 1.0))
    assert reason == f"contains {CANARY!r}"
    assert inbound(WORDS, deny_patterns=(r"evil\.example",)).why_not(sample(WORDS, text, 1.0)) is not None


def test_a_peer_group_with_a_canary_is_left_out_whole_and_counted() -> None:
    flt = inbound(WORDS, DEFAULT_DENY_PATTERNS, (CANARY,))
    honest = [sample(WORDS, "It is 95.", 1.0, "peer-a", n) for n in range(4)]
    hostile = [sample(WORDS, f"{CANARY} says 95", 1.0, "peer-b", 0)] + \
              [sample(WORDS, "wrong: 12", 0.0, "peer-b", n) for n in range(1, 4)]
    other_prompt = [sample(WORDS, "It is 7.", 0.0, "peer-b", n, prompt=1) for n in range(4)]
    own = [sample(WORDS, f"{CANARY} 95", 1.0, "me", n) for n in range(4)]  # own text is not checked inbound
    kept, dropped = filter_pool(honest + hostile + other_prompt + own, "me", flt)
    assert dropped == 4
    assert kept == tuple(honest + other_prompt + own)
    assert filter_pool(hostile, "me", None) == (tuple(hostile), 0)


def test_outbound_a_planted_canary_never_leaves_and_its_group_is_withheld_whole() -> None:
    flt = outbound(DEFAULT_DENY_PATTERNS, (CANARY,))
    leaking = [sample(CHAIN, "47+28=75\n75+15=90\nAnswer: 90", 1.0, "me", n) for n in range(3)] + \
              [sample(CHAIN, f"my notes at {CANARY}", 0.0, "me", 3)]
    clean = [sample(CHAIN, "garbled \x1b text", 1.0, "me", n, prompt=1) for n in range(4)]  # format not checked
    sent, withheld = withhold_groups(leaking + clean, flt)
    assert withheld == 4 and sent == tuple(clean)
    assert not any(CANARY in t.response_text for t in sent)
    assert withhold_groups(leaking, None) == (tuple(leaking), 0)


class _Cfg:
    def __init__(self, **kw) -> None:
        self.inbound_filter, self.outbound_filter = kw.get("inbound", True), kw.get("outbound", True)
        self.deny_patterns, self.deny_strings = kw.get("patterns", DEFAULT_DENY_PATTERNS), kw.get("strings", ())


def test_filters_follow_the_config_and_refuse_a_deny_list_that_drops_honest_answers() -> None:
    inbound_filter, outbound_filter = filters_for(_Cfg(strings=(CANARY,)), CHAIN)
    assert inbound_filter.format == response_format(CHAIN) and outbound_filter.format is None
    assert outbound_filter.deny_strings == (CANARY,)
    assert filters_for(_Cfg(inbound=False, outbound=False), CHAIN) == (None, None)
    with pytest.raises(ValueError, match=r"^the text filter refuses the reference solution of chain-.*"
                                         r"\(contains 'Answer'\): loosen deny_patterns"):
        filters_for(_Cfg(strings=("Answer",)), CHAIN)
