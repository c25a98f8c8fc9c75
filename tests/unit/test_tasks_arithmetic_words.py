"""ArithmeticTask's "words" style: chat prompts, their own prompt ids, the last-integer verifier,
multiplication, and a default style that stays exactly as it was."""

from __future__ import annotations

import pytest

from hacfed.tasks.arithmetic import ArithmeticTask, verify_last_integer
from hacfed.tasks.registry import load_task


def test_words_prompts_ask_in_a_sentence() -> None:
    task = ArithmeticTask(style="words", num_train=50, num_eval=10)
    p = task.train_problems()[0]
    a, b = p.prompt_id.split(":")[1].split("+")
    assert p.messages[0].content == f"What is {a} + {b}? Reply with only the number."
    assert p.answer == str(int(a) + int(b)) and task.name == "arith-add2-words"


def test_words_style_has_the_same_problems_under_other_ids() -> None:
    sym = ArithmeticTask(operators="+-", num_train=300, num_eval=50, num_validation=20)
    words = ArithmeticTask(operators="+-", num_train=300, num_eval=50, num_validation=20, style="words")
    for split in ("train_problems", "eval_problems", "validation_problems"):
        old, new = getattr(sym, split)(), getattr(words, split)()
        assert [p.answer for p in old] == [p.answer for p in new]
        assert {p.prompt_id for p in old}.isdisjoint({p.prompt_id for p in new})
        assert [p.prompt_id.replace(":", "w:", 1) for p in old] == [p.prompt_id for p in new]
    assert words.problem(words.eval_problems()[0].prompt_id) == words.eval_problems()[0]


def test_default_style_is_unchanged() -> None:
    task = ArithmeticTask(num_train=10, num_eval=5)
    assert task.name == "arith-add2" and task.style == "symbols"
    p = task.eval_problems()[0]
    assert p.prompt_id == "add2:" + p.messages[0].content[:-1] and p.messages[0].content.endswith("=")
    # Exact match only: extra text scores 0, as it always did.
    assert task.verify(p, p.answer).reward == 1.0
    assert task.verify(p, f"The answer is {p.answer}.").reward == 0.0


def test_words_verifier_takes_the_last_integer() -> None:
    task = ArithmeticTask(style="words", num_train=10, num_eval=5)
    p = task.eval_problems()[0]
    assert task.verify(p, f"The answer is {p.answer}.").reward == 1.0
    assert task.verify(p, f"{int(p.answer) + 1}").reward == 0.0


@pytest.mark.parametrize(("response", "reward"), [
    ("The answer is 80.", 1.0), ("80", 1.0), ("51 + 29 = 80", 1.0), ("80, not 79", 0.0), ("79 or 80", 1.0),
    ("-80", 0.0), ("80.5", 0.0), ("8,0", 0.0), ("", 0.0), ("no number", 0.0),
])
def test_verify_last_integer(response: str, reward: float) -> None:
    assert verify_last_integer("80", response).reward == reward


def test_thousands_separators_are_read() -> None:
    assert verify_last_integer("1080", "It is 1,080.").reward == 1.0
    assert verify_last_integer("1080", "It is 1,08.").reward == 0.0


def test_multiplication_reads_times_in_words() -> None:
    task = ArithmeticTask(digits=1, operators="*", num_train=30, num_eval=10, style="words")
    p = task.train_problems()[0]
    a, b = p.prompt_id.removeprefix("mul1w:").split("*")
    assert p.messages[0].content == f"What is {a} times {b}? Reply with only the number."
    assert p.answer == str(int(a) * int(b))


def test_registry_selects_the_style_and_refuses_a_bad_one() -> None:
    task = load_task({"kind": "arithmetic", "style": "words", "num_train": 20, "num_eval": 5})
    assert task.eval_problems()[0].prompt_id.startswith("add2w:")
    with pytest.raises(ValueError, match="style"):
        load_task({"kind": "arithmetic", "style": 3})
    with pytest.raises(ValueError, match="style"):
        load_task({"kind": "arithmetic", "style": "prose"})


def test_sim_task_add2_words_carries_its_own_budget() -> None:
    from hacfed.tasks.arithmetic import WORDS_MAX_NEW_TOKENS
    from hacfed.tools.sim import response_budget
    from hacfed.tools.sim_cli import _task_spec

    spec = _task_spec("add2-words", 2)
    task = load_task(spec)
    assert task.eval_problems()[0].messages[0].content.startswith("What is ")
    assert response_budget(None, task) == WORDS_MAX_NEW_TOKENS and response_budget(12, task) == 12
    assert _task_spec("add2-words", 3)["digits"] == 3 and _task_spec("add2", 2)["kind"] == "arithmetic"


def test_a_hostile_lab_s_endless_integer_scores_zero_instead_of_raising() -> None:
    """int() refuses strings of over 4,300 digits: a lab's response ending in one must be a wrong answer
    for the coordinator's re-verification, not a ValueError."""
    assert verify_last_integer("80", "9" * 5000).reward == 0.0
    assert verify_last_integer("80", "1," * 3000 + "000").reward == 0.0
    assert verify_last_integer("80", "9" * 5000 + " so the answer is 80").reward == 1.0
    task = ArithmeticTask(style="words")
    assert task.verify(task.train_problems()[0], "7" * 100_000).reward == 0.0


def test_worked_solutions_write_the_sum_out_on_the_same_problems() -> None:
    """solution_form="worked" changes only what a warm-up teaches: `37 + 58 = 95`, scored by the same
    last-integer verifier, on the same prompts, ids and splits."""
    plain = ArithmeticTask(style="words", num_train=300, num_eval=50, num_validation=20)
    worked = ArithmeticTask(style="words", num_train=300, num_eval=50, num_validation=20, solution_form="worked")
    assert worked.name == "arith-add2-words-worked" and plain.name == "arith-add2-words"
    for split in ("train_problems", "eval_problems", "validation_problems"):
        old, new = getattr(plain, split)(), getattr(worked, split)()
        assert [(p.prompt_id, p.messages, p.answer) for p in old] == [(p.prompt_id, p.messages, p.answer) for p in new]
        for p in new:
            a, b = p.prompt_id.split(":")[1].split("+")
            assert p.solution == f"{a} + {b} = {p.answer}"
            assert worked.verify(p, p.solution).reward == 1.0
    assert plain.train_problems()[0].solution == plain.train_problems()[0].answer
    assert load_task({"kind": "arithmetic", "style": "words", "solution_form": "worked"}).name == worked.name


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"solution_form": "worked"}, "needs style 'words'"),
    ({"style": "words", "solution_form": "steps"}, "solution_form must be one of"),
])
def test_worked_solutions_are_refused_where_they_cannot_score(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ArithmeticTask(**kwargs)
