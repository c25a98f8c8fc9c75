"""Domain types of one federation round (docs/design.md "What crosses the wire"). Torch-free.

The coordinator owns every setting that must agree across organizations and sends it in the
`RoundPlan`. One exchange per round: the coordinator sends a `RoundUpdate` (pool and capabilities of
round r, plan of round r+1); the participant trains on the pool, rolls out the plan and answers
with a `Submission` (its trajectories for the plan plus a `StepReport` of round r).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

from hacfed.hacpo_config import HacpoConfig
from hacfed.trajectory import ChatMessage, Trajectory


@dataclass(frozen=True)
class SamplingParams:
    """Rollout sampling the whole federation agrees on. Top-k/top-p truncation stays off for training."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 16

    def __post_init__(self) -> None:
        if not (_is_number(self.temperature) and math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"SamplingParams.temperature must be a number > 0, got {self.temperature!r}")
        if not (_is_number(self.top_p) and 0 < self.top_p <= 1):
            raise ValueError(f"SamplingParams.top_p must be a number in (0, 1], got {self.top_p!r}")
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"SamplingParams.max_new_tokens must be an int >= 1, got {self.max_new_tokens!r}")


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class PlannedPrompt:
    prompt_id: str
    messages: tuple[ChatMessage, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.prompt_id, str) or not self.prompt_id:
            raise ValueError(f"PlannedPrompt.prompt_id must be a non-empty string, got {self.prompt_id!r}")
        if not self.messages:
            raise ValueError(f"PlannedPrompt {self.prompt_id!r} has no messages")


# Who holds the answer keys (docs/design.md, "Answer keys"): "public": every lab loads the task's answers
# itself and claims each sample's reward, which the coordinator re-verifies; "coordinator": labs receive
# the questions only, claim nothing, and learn their samples' verified rewards from the next pool.
ANSWER_KEYS = ("public", "coordinator")


@dataclass(frozen=True)
class RoundPlan:
    """What every participant rolls out in round `round_id`: the same prompts, G samples each.
    answer_keys: one of ANSWER_KEYS; with "coordinator" a lab claims no reward (it sends 0.0)."""

    run_id: str
    round_id: int
    prompts: tuple[PlannedPrompt, ...]
    group_size: int
    sampling: SamplingParams
    hacpo: HacpoConfig
    evaluate: bool = False
    answer_keys: str = "public"

    def __post_init__(self) -> None:
        if not self.run_id:
            raise ValueError("RoundPlan.run_id must be non-empty")
        if self.answer_keys not in ANSWER_KEYS:
            raise ValueError(f"RoundPlan.answer_keys must be one of {ANSWER_KEYS}, got {self.answer_keys!r}")
        if isinstance(self.round_id, bool) or not isinstance(self.round_id, int) or self.round_id < 0:
            raise ValueError(f"RoundPlan.round_id must be an int >= 0, got {self.round_id!r}")
        if isinstance(self.group_size, bool) or not isinstance(self.group_size, int) or self.group_size < 1:
            raise ValueError(f"RoundPlan.group_size must be an int >= 1, got {self.group_size!r}")
        ids = [p.prompt_id for p in self.prompts]
        if len(set(ids)) != len(ids):
            raise ValueError(f"RoundPlan {self.round_id}: duplicate prompt ids")

    @property
    def prompt_ids(self) -> tuple[str, ...]:
        return tuple(p.prompt_id for p in self.prompts)

# How a coordinator picks the peer groups of a lab's `RoundUpdate.pool` where a prompt has more than
# K (hacfed.server.coordinator.pool_share): "drawn" by a keyed hash, or those with the most verified
# reward. Here, not in the coordinator, so `hacfed sim` and the bench matrix can name the choices
# without importing the coordinator.
PEER_CHOICES = ("drawn", "successes")

# Which round a lab rolls out when it starts a step under bounded staleness (hacfed.server.coordinator.engine,
# docs/staleness.md): "every" round, or the "newest" open one. Here for the same reason as PEER_CHOICES.
ROUND_JOINS = ("every", "newest")


@dataclass(frozen=True)
class RoundUpdate:
    """Coordinator -> participant: the accepted pool of `pool_round` (None before the first round),
    capabilities P̂ after that round, and the plan to roll out next (None after the last round)."""

    run_id: str
    pool_round: int | None
    pool: tuple[Trajectory, ...]
    capabilities: Mapping[str, float]
    next_plan: RoundPlan | None
    participants: tuple[str, ...] = ()
    hacpo: HacpoConfig = field(default_factory=HacpoConfig)

    def __post_init__(self) -> None:
        for agent, cap in self.capabilities.items():
            if not (isinstance(cap, (int, float)) and math.isfinite(cap) and 0 < cap <= 1):
                raise ValueError(f"RoundUpdate capability of {agent!r} must be in (0, 1], got {cap!r}")


@dataclass(frozen=True)
class StepReport:
    """Participant -> coordinator: metrics of training on a pool and of evaluation (if it ran)."""

    participant_id: str
    round_id: int
    metrics: Mapping[str, float] = field(default_factory=dict)
    eval_accuracy: float | None = None

    def __post_init__(self) -> None:
        for key, value in self.metrics.items():
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise ValueError(f"StepReport metric {key!r} must be a number, got {value!r}")
        if self.eval_accuracy is not None and not (0.0 <= self.eval_accuracy <= 1.0):
            raise ValueError(f"StepReport.eval_accuracy must be in [0, 1], got {self.eval_accuracy!r}")


# A submission nonce: 128 random bits as lowercase hex (security.md T4).
NONCE_HEX_CHARS = 32


def _is_hex(text: str, length: int) -> bool:
    return isinstance(text, str) and len(text) == length and all(c in "0123456789abcdef" for c in text)


@dataclass(frozen=True)
class Submission:
    """Participant -> coordinator: all G samples for every prompt of `round_id`'s plan.

    `nonce` (32 hex chars = 128 bits, e.g. `secrets.token_hex(16)`) and `created_at_ms` make each
    submission unique, so the coordinator can tell an identical resend (idempotent) from a reused
    nonce with a different payload (security.md T4). "" means "not set" (in-process tests).
    """

    run_id: str
    participant_id: str
    round_id: int
    trajectories: tuple[Trajectory, ...]
    report: StepReport | None = None
    nonce: str = ""
    created_at_ms: int = 0

    def __post_init__(self) -> None:
        for name in ("run_id", "participant_id"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"Submission.{name} must be a non-empty string, got {value!r}")
        if isinstance(self.round_id, bool) or not isinstance(self.round_id, int) or self.round_id < 0:
            raise ValueError(f"Submission.round_id must be an int >= 0, got {self.round_id!r}")
        if self.nonce and not _is_hex(self.nonce, NONCE_HEX_CHARS):
            raise ValueError(
                f"Submission.nonce must be {NONCE_HEX_CHARS} lowercase hex chars or empty, got {self.nonce!r}"
            )
        ms = self.created_at_ms
        if isinstance(ms, bool) or not isinstance(ms, int) or ms < 0:
            raise ValueError(f"Submission.created_at_ms must be an int >= 0, got {ms!r}")

