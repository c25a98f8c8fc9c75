"""The example task's own tests: `python -m pytest examples/hacfed-task-example/tests`."""

from __future__ import annotations

import json
from importlib.metadata import entry_points
from pathlib import Path

import hacfed_task_example as task

DATA = Path(__file__).resolve().parents[1] / "data"


def test_reward_is_one_when_the_response_ends_with_the_reversed_word_else_the_letters_in_place() -> None:
    problem = {"prompt_id": "reverse-word:x", "question": "apple", "answer": "elppa", "prompt": "..."}
    assert task.reward(problem, "It is elppa\n") == 1.0
    assert task.reward(problem, "elppx") == 0.8  # e, l, p, p in place
    assert task.reward(problem, "I say zzzz") == 0.0
    assert task.reward(problem, "ppa") == 0.6  # the last three letters
    assert task.reward(problem, "elppa, I think") == 0.0
    assert task.reward(problem, "apple") == 0.2  # the middle p
    assert task.reward(problem, "") == 0.0
    assert task.reward({**problem, "answer": ""}, "anything") == 1.0
    assert all(type(task.reward(problem, r)) is float for r in ("", "elppa", "x"))


def test_problems_match_the_data_files() -> None:
    for split in ("train", "eval"):
        rows = [json.loads(line) for line in (DATA / f"{split}.jsonl").read_text().splitlines()]
        assert rows == task.problems(split)
    train = {p["question"] for p in task.problems("train")}
    assert len(train) == 48 and not train & {p["question"] for p in task.problems("eval")}
    assert "{question}" in task.prompt_template


def test_the_entry_point_is_installed() -> None:
    found = list(entry_points(group="hacfed.tasks", name="reverse-word"))
    assert [ep.value for ep in found] == ["hacfed_task_example"], (
        "pip install --no-deps -e examples/hacfed-task-example"
    )
