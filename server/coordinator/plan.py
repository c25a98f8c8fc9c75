"""Deterministic prompt plans: which prompts every participant answers in a round.

Runs in the coordinator's ServerApp process (the Flower ServerApp that hacfed-server's SuperLink
starts, through `hacfed.server.driver`) and, in-process, in `hacfed sim`.

HACPO needs every agent to answer the same prompts (docs/hacpo.md §1), so a round has one plan for all
participants. The prompts are the `prompts_per_round` train problems with the smallest
sha256(run_id, seed, round_id, prompt_id): a pure function of the configuration and the task's
prompt ids, identical on every machine, Python version and restart, and independent of the order in
which the task lists its problems. Rounds draw independently (a prompt may recur in a later round).

The coordinator picks the prompts, never the participant, so nobody can cherry-pick easy ones
(security.md T6); the sampling and HACPO settings travel in the plan so all labs agree on them, and
so does who holds the answers (`answer_keys`): a plan never carries an answer, only questions.
"""

from __future__ import annotations

import hashlib
import heapq
import json
from dataclasses import asdict
from typing import Any, Mapping

from hacfed.hacpo_config import HacpoConfig
from hacfed.messages import PlannedPrompt, RoundPlan, SamplingParams
from hacfed.server.coordinator.config import CoordinatorConfig
from hacfed.tasks.base import Task
from hacfed.trajectory import ChatMessage

_DOMAIN = b"hacfed/plan/v1\x00"


def prompt_rank(run_id: str, seed: int, round_id: int, prompt_id: str) -> bytes:
    """The sort key of a prompt in a round: a domain-separated sha256 (32 bytes)."""
    material = "\x00".join((run_id, str(seed), str(round_id), prompt_id)).encode("utf-8")
    return hashlib.sha256(_DOMAIN + material).digest()


def make_plan(cfg: CoordinatorConfig, task: Task, round_id: int) -> RoundPlan:
    """The plan of `round_id`: the same `prompts_per_round` train prompts for every participant,
    G samples each, with the federation's sampling and HACPO settings; `evaluate` every `eval_every`
    rounds starting at round 0 (a baseline before any training)."""
    if isinstance(round_id, bool) or not isinstance(round_id, int) or round_id < 0:
        raise ValueError(f"round_id must be an int >= 0, got {round_id!r}")
    train = task.train_problems()
    if cfg.prompts_per_round > len(train):
        raise ValueError(
            f"CoordinatorConfig.prompts_per_round ({cfg.prompts_per_round}) exceeds the task's "
            f"{len(train)} train problems"
        )
    chosen = heapq.nsmallest(
        cfg.prompts_per_round,
        train,
        key=lambda p: (prompt_rank(cfg.run_id, cfg.seed, round_id, p.prompt_id), p.prompt_id),
    )
    return RoundPlan(
        run_id=cfg.run_id,
        round_id=round_id,
        prompts=tuple(PlannedPrompt(p.prompt_id, tuple(p.messages)) for p in chosen),
        group_size=cfg.group_size,
        sampling=cfg.sampling,
        hacpo=cfg.hacpo,
        evaluate=cfg.eval_every > 0 and round_id % cfg.eval_every == 0,
        answer_keys=cfg.answer_keys,
    )


def plan_to_dict(plan: RoundPlan) -> dict[str, Any]:
    """JSON-able form for the journal."""
    return {
        "run_id": plan.run_id,
        "round_id": plan.round_id,
        "prompts": [
            {"prompt_id": p.prompt_id, "messages": [m.as_dict() for m in p.messages]} for p in plan.prompts
        ],
        "group_size": plan.group_size,
        "sampling": asdict(plan.sampling),
        "hacpo": plan.hacpo.to_dict(),
        "evaluate": plan.evaluate,
        "answer_keys": plan.answer_keys,
    }


def plan_from_dict(data: Mapping[str, Any]) -> RoundPlan:
    return RoundPlan(
        run_id=data["run_id"],
        round_id=data["round_id"],
        prompts=tuple(
            PlannedPrompt(p["prompt_id"], tuple(ChatMessage(m["role"], m["content"]) for m in p["messages"]))
            for p in data["prompts"]
        ),
        group_size=data["group_size"],
        sampling=SamplingParams(**data["sampling"]),
        hacpo=HacpoConfig.from_dict(data["hacpo"]),
        evaluate=data["evaluate"],
        answer_keys=data.get("answer_keys", "public"),  # a plan journaled before the setting existed
    )


def plan_to_json(plan: RoundPlan) -> str:
    return json.dumps(plan_to_dict(plan), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def plan_from_json(text: str) -> RoundPlan:
    return plan_from_dict(json.loads(text))
