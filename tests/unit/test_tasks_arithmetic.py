"""ArithmeticTask: deterministic splits, stable ids, operators, and the exact-match verifier."""

from __future__ import annotations

import re

import pytest

from hacfed.tasks.arithmetic import ArithmeticTask, verify_exact_integer
from hacfed.tasks.base import Problem


def _exprs(problems: tuple[Problem, ...]) -> list[str]:
    return [p.messages[0].content for p in problems]


def test_same_seed_gives_the_same_problems_in_the_same_order() -> None:
    a = ArithmeticTask(digits=2, operators="+-", seed=3, num_train=300, num_eval=50)
    b = ArithmeticTask(digits=2, operators="+-", seed=3, num_train=300, num_eval=50)
    assert a.train_problems() == b.train_problems()
    assert a.eval_problems() == b.eval_problems()


def test_different_seed_gives_different_problems() -> None:
    a = ArithmeticTask(seed=0, num_train=200, num_eval=20)
    b = ArithmeticTask(seed=1, num_train=200, num_eval=20)
    assert _exprs(a.train_problems()) != _exprs(b.train_problems())
    assert _exprs(a.eval_problems()) != _exprs(b.eval_problems())


def test_prompt_ids_are_unique_and_name_the_expression() -> None:
    task = ArithmeticTask(digits=2, operators="+-", num_train=500, num_eval=100)
    problems = task.train_problems() + task.eval_problems()
    ids = [p.prompt_id for p in problems]
    assert len(set(ids)) == len(ids)
    for p in problems:
        # e.g. "add2:37+58" for the prompt "37+58="
        op_name, expr = p.prompt_id.split(":")
        assert op_name in ("add2", "sub2")
        assert p.messages[0].content == f"{expr}="
        assert task.problem(p.prompt_id) is p


def test_growing_num_train_keeps_eval_and_earlier_train_problems() -> None:
    small = ArithmeticTask(seed=5, num_train=100, num_eval=30)
    large = ArithmeticTask(seed=5, num_train=400, num_eval=30)
    assert small.eval_problems() == large.eval_problems()
    assert large.train_problems()[:100] == small.train_problems()


def test_train_and_eval_are_disjoint() -> None:
    task = ArithmeticTask(digits=2, operators="+-", num_train=2000, num_eval=200)
    train = set(_exprs(task.train_problems()))
    held_out = set(_exprs(task.eval_problems()))
    assert len(train) == 2000 and len(held_out) == 200
    assert not train & held_out


@pytest.mark.parametrize("digits", [1, 3, 5])
def test_digits_bounds_each_operand(digits: int) -> None:
    task = ArithmeticTask(digits=digits, operators="+", num_train=40, num_eval=5)
    for p in task.train_problems():
        a, b = re.fullmatch(r"(\d+)\+(\d+)=", p.messages[0].content).groups()  # type: ignore[union-attr]
        assert 0 <= int(a) < 10**digits and 0 <= int(b) < 10**digits
        assert int(p.answer) == int(a) + int(b)
        assert p.prompt_id.startswith(f"add{digits}:")
    assert task.name == f"arith-add{digits}"


def test_operators_option_selects_the_operations() -> None:
    plus = ArithmeticTask(operators="+", num_train=200, num_eval=10)
    minus = ArithmeticTask(operators="-", num_train=200, num_eval=10)
    both = ArithmeticTask(operators="+-", num_train=400, num_eval=10)
    assert all("+" in e for e in _exprs(plus.train_problems()))
    assert all("-" in e for e in _exprs(minus.train_problems()))
    ops = {"+" if "+" in e else "-" for e in _exprs(both.train_problems())}
    assert ops == {"+", "-"}
    assert both.name == "arith-addsub2"


def test_subtraction_is_never_negative_and_answers_are_right() -> None:
    task = ArithmeticTask(digits=3, operators="-", num_train=1000, num_eval=50)
    for p in task.train_problems() + task.eval_problems():
        a, b = re.fullmatch(r"(\d+)-(\d+)=", p.messages[0].content).groups()  # type: ignore[union-attr]
        assert int(a) >= int(b)
        assert p.answer == str(int(a) - int(b)) and int(p.answer) >= 0
        assert p.solution == p.answer


def test_gold_scores_one_and_wrong_answers_score_zero() -> None:
    task = ArithmeticTask(digits=2, operators="+-", num_train=100, num_eval=10)
    for p in task.train_problems()[:50]:
        assert task.verify(p, p.answer).reward == 1.0
        assert task.verify(p, f"  {p.answer}\n").reward == 1.0  # surrounding whitespace is fine
        wrong = task.verify(p, str(int(p.answer) + 1))
        assert wrong.reward == 0.0 and wrong.reason == "wrong answer"


@pytest.mark.parametrize(
    ("response", "reason"),
    [
        ("", "empty response"),
        ("   \n", "empty response"),
        ("forty-two", "not an integer"),
        ("42 apples", "not an integer"),
        ("4\x002", "not an integer"),
        ("\ud800", "not an integer"),
        ("9" * 65, "response too long for an integer answer"),
        ("1" * 1_000_000, "response too long for an integer answer"),
        (None, "response is not text"),
        (b"42", "response is not text"),
    ],
)
def test_garbage_scores_zero_with_a_reason(response: object, reason: str) -> None:
    verdict = verify_exact_integer("42", response)  # type: ignore[arg-type]
    assert verdict.reward == 0.0
    assert verdict.reason == reason


def test_unknown_prompt_id_is_a_key_error_naming_it() -> None:
    task = ArithmeticTask(num_train=10, num_eval=5)
    with pytest.raises(KeyError, match="add2:999"):
        task.problem("add2:999+1")


@pytest.mark.parametrize(
    "kwargs",
    [{"digits": 0}, {"digits": 10}, {"digits": True}, {"operators": "/"}, {"operators": "++"}, {"operators": ""},
     {"num_train": 0}, {"digits": 1, "num_train": 200}, {"style": "prose"}, {"style": None}],
)
def test_bad_options_are_value_errors(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="ArithmeticTask"):
        ArithmeticTask(**kwargs)  # type: ignore[arg-type]


def test_validation_split_is_disjoint_and_never_moves_the_other_splits() -> None:
    with_val = ArithmeticTask(digits=2, num_validation=200)  # the zoo and the sim use 200
    without = ArithmeticTask(digits=2, num_validation=0)
    # Validation problems are drawn after train: the other two splits are the same either way.
    assert with_val.train_problems() == without.train_problems()
    assert with_val.eval_problems() == without.eval_problems()
    ids = lambda split: {p.prompt_id for p in split}  # noqa: E731
    val = ids(with_val.validation_problems())
    assert len(val) == 200 and not val & ids(with_val.train_problems()) and not val & ids(with_val.eval_problems())
    assert without.validation_problems() == ()
    # Every split's problems can be looked up by id (the coordinator verifies any of them).
    p = with_val.validation_problems()[0]
    assert with_val.problem(p.prompt_id) == p
