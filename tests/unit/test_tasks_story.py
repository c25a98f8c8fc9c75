"""The add2-story task: story prompts, three disjoint seeded splits, and a verifier that reads only a
marked final answer `Answer: N` in ASCII digits."""

from __future__ import annotations

import pytest

from hacfed.response_format import response_format
from hacfed.tasks.base import Problem
from hacfed.tasks.registry import load_task, task_sampling_defaults
from hacfed.tasks.story import MAX_RESPONSE_CHARS, STORY_MAX_NEW_TOKENS, SUFFIX, StoryTask, verify_story_answer
from hacfed.tools.sim import TASKS

TASK = StoryTask()


def _sum_of(problem: Problem) -> tuple[str, int, int]:
    body = problem.prompt_id.split(":", 1)[1]
    op = "+" if "+" in body else "-"
    a, b = body.split(op)
    return op, int(a), int(b)


def test_splits_are_sized_disjoint_and_share_no_sum() -> None:
    train, validation, test = TASK.train_problems(), TASK.validation_problems(), TASK.eval_problems()
    assert (len(train), len(validation), len(test)) == (4000, 200, 500)
    sums = [_sum_of(p) for p in (*train, *validation, *test)]
    assert len(set(sums)) == len(sums)  # no sum twice, so no prompt id twice in or across splits
    assert TASK.problem(validation[0].prompt_id) == validation[0]


def test_splits_are_seeded_and_a_larger_train_split_moves_no_held_out_problem() -> None:
    again, bigger, other = StoryTask(), StoryTask(num_train=5000), StoryTask(seed=1)
    assert again.train_problems() == TASK.train_problems()
    assert bigger.validation_problems() == TASK.validation_problems()
    assert bigger.eval_problems() == TASK.eval_problems()
    assert bigger.train_problems()[:4000] == TASK.train_problems()
    assert other.eval_problems() != TASK.eval_problems()


def test_prompts_are_stories_of_both_operations_within_range() -> None:
    problems = TASK.validation_problems()
    assert {_sum_of(p)[0] for p in problems[:2]} == {"+", "-"}  # they alternate
    for p in problems:
        op, a, b = _sum_of(p)
        text = p.messages[0].content
        assert text.endswith(SUFFIX) and f"{a}" in text and f"{b}" in text, text
        assert 10 <= a <= 99 and 10 <= b <= 99
        assert int(p.answer) == (a + b if op == "+" else a - b) >= 1
    assert len({p.messages[0].content.split(" ")[0] for p in problems}) > 5  # names and templates vary


def test_every_reference_solution_scores_and_fits_the_format() -> None:
    fmt = response_format(TASK)
    for p in (*TASK.validation_problems(), *TASK.eval_problems()):
        assert p.solution.endswith(f"\nAnswer: {p.answer}")
        assert TASK.verify(p, p.solution).reward == 1.0
        assert fmt.fits(p.solution, 1.0)
    assert not fmt.fits("39", 1.0) and fmt.max_chars == MAX_RESPONSE_CHARS


@pytest.mark.parametrize(("response", "reward"), [
    ("19 + 20 = 39\nAnswer: 39", 1.0),
    ("Tom has 19 + 20 = 39 apples now.\n\n**Answer:** 39", 1.0),
    ("**Answer: 39**", 1.0),
    ("Answer: 39.", 1.0),
    ("Answer: 39 apples", 1.0),
    ("Answer: 40", 0.0),  # wrong
    ("39", 0.0),  # not marked
    ("The answer is 39.", 0.0),
    ("Answer: 39, or maybe 40", 0.0),  # the last integer is not the marked one
    ("Answer: 40\nAnswer: 39\nAnswer: 41", 0.0),  # listing candidates: the last one counts
    ("Answer: 39.5", 0.0),  # a decimal is no integer
    ("Answer: \uff13\uff19", 0.0),  # full-width digits are no ASCII integer
    ("Answer: \u0663\u0669", 0.0),  # Arabic-Indic digits
    ("answer: 39", 0.0),
    ("Answer:\n39", 0.0),
    ("", 0.0),
    ("x" * MAX_RESPONSE_CHARS + "\nAnswer: 39", 0.0),  # over the length cap
    ("Answer: " + "9" * (MAX_RESPONSE_CHARS - 8), 0.0),  # a huge number within the cap: no int() error
])
def test_the_verifier_reads_the_marked_last_integer_only(response: str, reward: float) -> None:
    assert verify_story_answer("39", response).reward == reward


def test_the_verifier_refuses_what_is_not_text() -> None:
    assert verify_story_answer("39", None).reward == 0.0  # type: ignore[arg-type]


def test_the_task_loads_by_name_with_its_budget_and_says_what_it_ignores() -> None:
    spec, budget = TASKS["add2-story"]
    assert budget is None and load_task(spec) == TASK
    assert TASK.max_new_tokens == STORY_MAX_NEW_TOKENS
    assert task_sampling_defaults(spec) == {"max_new_tokens": STORY_MAX_NEW_TOKENS}
    assert "before the final 'Answer: N'" in TASK.verifier_ignores
    with pytest.raises(ValueError, match="unknown key"):
        load_task({"kind": "story", "digits": 3})
    with pytest.raises(ValueError, match="'num_train' must be int"):
        load_task({"kind": "story", "num_train": "10"})


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"num_train": 0}, "num_train must be an int >= 1"),
    ({"seed": -1}, "seed must be an int >= 0"),
    ({"num_train": 6000}, "at most 6000"),
])
def test_bad_sizes_are_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        StoryTask(**kwargs)
