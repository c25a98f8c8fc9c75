"""Shared fakes for the coordinator tests: a small config, a fake clock, scripted participants.

Scripted submissions answer every planned prompt with G samples: sample 0 the correct answer,
the others a wrong one, so each group has mixed rewards and the verifier's verdict is known.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from pathlib import Path
from typing import Any

from hacfed.messages import RoundPlan, RoundUpdate, StepReport, Submission
from hacfed.server.coordinator import Coordinator, CoordinatorConfig, Journal
from hacfed.tasks.arithmetic import ArithmeticTask
from hacfed.trajectory import ChatMessage, Trajectory

TASK = ArithmeticTask(digits=2, num_train=200, num_eval=20)  # what make_config()["task"] describes


class FakeClock:
    """A clock that only moves when told; `sleep` advances it (for run_rounds)."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.t = start
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.t += seconds


def make_config(state_dir: Path, **overrides: Any) -> CoordinatorConfig:
    base: dict[str, Any] = dict(
        run_id="test-run", task={"kind": "arithmetic", "digits": 2, "num_train": 200, "num_eval": 20},
        rounds=3, prompts_per_round=2,
        group_size=3, expected_participants=2, min_participants=1, round_deadline_s=100.0,
        state_dir=str(state_dir), eval_every=2, sampling={"max_new_tokens": 8},
    )
    return CoordinatorConfig.from_mapping(base).with_overrides(overrides)


def make_coordinator(state_dir: Path, clock: FakeClock | None = None, task=TASK, **overrides: Any) -> Coordinator:
    cfg = make_config(state_dir, **overrides)
    return Coordinator(cfg, task, Journal(cfg.journal_path), clock=clock or FakeClock())


def wrong_answer(answer: str) -> str:
    return str(int(answer) + 1)


def scripted_trajectories(
    plan: RoundPlan, pid: str, task=TASK, *, falsify: int = 0, version: int = 0, tag: str = ""
) -> list[Trajectory]:
    """G samples per planned prompt with honest claimed rewards; the first `falsify` wrong samples
    (in plan order) claim reward 1.0 instead of 0.0."""
    out = []
    for prompt in plan.prompts:
        problem = task.problem(prompt.prompt_id)
        for i in range(plan.group_size):
            text = problem.answer if i == 0 else wrong_answer(problem.answer)
            reward = task.verify(problem, text).reward
            if reward == 0.0 and falsify > 0:
                reward, falsify = 1.0, falsify - 1
            out.append(Trajectory(
                trajectory_id=f"{pid}/{plan.round_id}/{prompt.prompt_id}/{i}{tag}", prompt_id=prompt.prompt_id,
                source_id=pid, policy_version=version, prompt=prompt.messages, response_text=text, reward=reward,
                source_logp_sum=-0.5 * len(text), source_token_count=len(text), finish_reason="stop",
            ))
    return out


def scripted_submission(
    plan: RoundPlan, pid: str, *, falsify: int = 0, eval_accuracy: float | None = None, **kw: Any
) -> Submission:
    trajectories = kw.pop("trajectories", None) or scripted_trajectories(plan, pid, falsify=falsify)
    report = StepReport(pid, max(plan.round_id - 1, 0), {"loss": 0.25}, eval_accuracy)
    return Submission(plan.run_id, pid, plan.round_id, tuple(trajectories), report, **kw)


class ScriptedLab:
    """A participant endpoint that answers every plan with `scripted_submission` and keeps every update
    it was sent (`sent`); for the in-process and paced transports."""

    def __init__(self, pid: str) -> None:
        self.participant_id, self.sent = pid, []

    def exchange(self, update: Any) -> Submission | None:
        self.sent.append(update)
        plan = update.next_plan
        return None if plan is None else scripted_submission(plan, self.participant_id)


def trajectory_of_row(row: sqlite3.Row) -> Trajectory:
    """The trajectory a row of the journal's `trajectory_rows` view holds, read column by column: what
    `Journal.pool` must give back for it."""
    return Trajectory(
        trajectory_id=row["trajectory_id"], prompt_id=row["prompt_id"], source_id=row["participant_id"],
        policy_version=row["policy_version"],
        prompt=tuple(ChatMessage(m["role"], m["content"]) for m in json.loads(row["prompt_json"])),
        response_text=row["response_text"], reward=row["reward"], source_logp_sum=row["source_logp_sum"],
        source_token_count=row["source_token_count"], finish_reason=row["finish_reason"],
    )


def replace_at(trajectories: list[Trajectory], index: int, **changes: Any) -> list[Trajectory]:
    out = list(trajectories)
    out[index] = dataclasses.replace(out[index], **changes)
    return out


class ScriptedEndpoint:
    """A participant as run_rounds sees it. behavior: honest | cheat | raise | absent.
    Records every update it got, so tests can check pools and plans."""

    def __init__(self, participant_id: str, behavior: str = "honest", falsify: int = 1) -> None:
        self.participant_id = participant_id
        self.behavior = behavior
        self.falsify = falsify
        self.updates: list[RoundUpdate] = []

    def exchange(self, update: RoundUpdate) -> Submission | None:
        self.updates.append(update)
        if self.behavior == "raise":
            raise RuntimeError(f"{self.participant_id} crashed")
        if self.behavior == "absent":
            return None
        plan = update.next_plan
        if plan is None:  # the final update: report training on the last pool
            return Submission(update.run_id, self.participant_id, update.pool_round + 1, (),
                              StepReport(self.participant_id, update.pool_round + 1, {"loss": 0.1}, 0.9))
        falsify = self.falsify if self.behavior == "cheat" else 0
        return scripted_submission(
            plan, self.participant_id, falsify=falsify, eval_accuracy=0.5 if plan.evaluate else None
        )


def test_scripted_submission_is_honest_and_verifiable(tmp_path):
    coord = make_coordinator(tmp_path)
    coord.register("a")
    plan = coord.open_round(0)
    trajectories = scripted_trajectories(plan, "a")
    assert len(trajectories) == len(plan.prompts) * plan.group_size
    # sample 0 of each group is right, the rest wrong: mixed rewards in every group
    assert [t.reward for t in trajectories] == [1.0, 0.0, 0.0] * len(plan.prompts)
    assert sum(t.reward for t in scripted_trajectories(plan, "a", falsify=2)) == len(plan.prompts) + 2
