"""Deterministic prompt plans: same prompts for everyone, stable across restarts and machines."""

from __future__ import annotations

import dataclasses
import json

import pytest

from hacfed.server.coordinator import make_plan, plan_from_dict, plan_to_dict
from hacfed.tasks.arithmetic import ArithmeticTask
from tests.unit.test_coordinator_fakes import TASK, make_config


class ReversedTask:
    """The same problems listed in the opposite order."""

    name = TASK.name

    def train_problems(self):
        return tuple(reversed(TASK.train_problems()))

    def eval_problems(self):
        return TASK.eval_problems()

    def problem(self, prompt_id):
        return TASK.problem(prompt_id)

    def verify(self, problem, response):
        return TASK.verify(problem, response)


def test_plan_is_pinned_by_run_seed_and_round(tmp_path):
    cfg = make_config(tmp_path, prompts_per_round=3, seed=7)
    # Pinned values: a change here means every running federation would get different prompts
    # after an upgrade; only change them together with the plan's hash domain ("hacfed/plan/v1").
    assert make_plan(cfg, TASK, 0).prompt_ids == ("add2:7+42", "add2:35+51", "add2:41+44")
    assert make_plan(cfg, TASK, 1).prompt_ids == ("add2:43+62", "add2:31+3", "add2:25+13")


def test_plan_is_independent_of_task_listing_order_and_repeatable(tmp_path):
    cfg = make_config(tmp_path, prompts_per_round=5)
    plan = make_plan(cfg, TASK, 3)
    assert make_plan(cfg, ReversedTask(), 3) == plan
    assert make_plan(cfg, ArithmeticTask(digits=2, num_train=200, num_eval=20), 3) == plan  # a "restart"


def test_plan_changes_with_round_seed_and_run(tmp_path):
    cfg = make_config(tmp_path, prompts_per_round=5)
    ids = make_plan(cfg, TASK, 0).prompt_ids
    assert make_plan(cfg, TASK, 1).prompt_ids != ids
    assert make_plan(cfg.with_overrides({"seed": 1}), TASK, 0).prompt_ids != ids
    assert make_plan(cfg.with_overrides({"run_id": "other"}), TASK, 0).prompt_ids != ids


def test_plan_carries_the_federation_settings(tmp_path):
    cfg = make_config(tmp_path, prompts_per_round=4, group_size=5, eval_every=3, **{"hacpo.alpha": 0.5})
    plan = make_plan(cfg, TASK, 6)
    assert plan.run_id == cfg.run_id and plan.round_id == 6
    assert plan.group_size == 5 and plan.sampling == cfg.sampling and plan.hacpo.alpha == 0.5
    train_ids = {p.prompt_id for p in TASK.train_problems()}
    assert len(plan.prompts) == 4 and set(plan.prompt_ids) <= train_ids
    for prompt in plan.prompts:
        assert prompt.messages == TASK.problem(prompt.prompt_id).messages
    assert [make_plan(cfg, TASK, r).evaluate for r in range(7)] == [True, False, False, True, False, False, True]
    assert not any(make_plan(cfg.with_overrides({"eval_every": 0}), TASK, r).evaluate for r in range(4))


def test_never_draws_from_the_eval_split_and_checks_size(tmp_path):
    eval_ids = {p.prompt_id for p in TASK.eval_problems()}
    cfg = make_config(tmp_path, prompts_per_round=50)
    for r in range(5):
        assert not set(make_plan(cfg, TASK, r).prompt_ids) & eval_ids
    with pytest.raises(ValueError, match="prompts_per_round \\(201\\) exceeds"):
        make_plan(make_config(tmp_path, prompts_per_round=201), TASK, 0)
    with pytest.raises(ValueError, match="round_id"):
        make_plan(cfg, TASK, -1)


def test_plan_json_round_trip(tmp_path):
    plan = make_plan(make_config(tmp_path), TASK, 2)
    data = json.loads(json.dumps(plan_to_dict(plan)))
    assert plan_from_dict(data) == plan
    flipped = dataclasses.replace(plan, evaluate=not plan.evaluate)
    assert plan_from_dict({**data, "evaluate": not plan.evaluate}) == flipped
