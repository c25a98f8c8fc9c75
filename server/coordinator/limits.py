"""Per-participant rate limits and per-round quotas on submissions (security.md T8, S5).

Runs in the coordinator's ServerApp process (the Flower ServerApp that hacfed-server's SuperLink
starts, through `hacfed.server.driver`) and, in-process, in `hacfed sim`.

Three caps, each with its own code and a retry-after hint, all checked BEFORE any costly work:
  - a token bucket per participant (`rate_limit_per_s`, `rate_limit_burst`): every submission
    attempt takes a token, resends and refused ones included (RATE_LIMITED, retry when one token
    has refilled). Opening a round refills every bucket, so a lab's submission of each round is
    never throttled however fast rounds go (an in-process simulation runs several per second);
    the bucket bounds what a lab can send WITHIN a round;
  - bytes received per participant and round (`round_quota_bytes`, QUOTA_BYTES);
  - trajectories received per participant and round (`round_quota_trajectories`,
    QUOTA_TRAJECTORIES).
The Flower driver takes the token and charges the byte quota with the raw envelope size before
it verifies a signature or parses anything (`Coordinator.admit`); the trajectory quota is charged
right after decoding, before hashing, validating or verifying. Quotas count what a participant
sends, accepted or not, so a flood costs the flooder its own quota and nobody else's. "Per
organization" is per participant id until identities carry an organization (the registry of keys, issue 9 part 1).

State is in memory: a restarted coordinator starts with full buckets and empty quotas, which is
harmless (a restart is rare and each participant still records one submission per round).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Hashable

from hacfed.server.coordinator.errors import ErrorCode
from hacfed.server.coordinator.validation import Rejection


@dataclass
class _Bucket:
    tokens: float
    updated: float


@dataclass
class _Usage:
    bytes: int = 0
    trajectories: int = 0


class SubmissionLimiter:
    """The caps of one coordinator. `round_key` is the round the quota is counted for (the open
    round when a submission arrives; anything hashable). Thread-safety comes from the caller
    (the coordinator holds its lock)."""

    def __init__(
        self, *, rate_per_s: float, burst: int, quota_bytes: int, quota_trajectories: int,
        clock: Callable[[], float], round_retry_s: Callable[[], float] | None = None,
    ) -> None:
        if not (rate_per_s > 0 and math.isfinite(rate_per_s)) or burst < 1 or quota_bytes < 1 or quota_trajectories < 1:
            raise ValueError(f"bad limits: rate {rate_per_s}, burst {burst}, quotas {quota_bytes}/{quota_trajectories}")
        self.rate_per_s, self.burst = float(rate_per_s), int(burst)
        self.quota_bytes, self.quota_trajectories = int(quota_bytes), int(quota_trajectories)
        self._clock = clock
        self._round_retry_s = round_retry_s or (lambda: 0.0)
        self._buckets: dict[str, _Bucket] = {}
        self._usage: dict[tuple[str, Hashable], _Usage] = {}

    def take_token(self, participant_id: str) -> Rejection | None:
        """One submission attempt: take a token from the participant's bucket; the refusal, or None."""
        now = self._clock()
        bucket = self._buckets.setdefault(participant_id, _Bucket(float(self.burst), now))
        bucket.tokens = min(float(self.burst), bucket.tokens + max(now - bucket.updated, 0.0) * self.rate_per_s)
        bucket.updated = now
        if bucket.tokens < 1.0:
            wait = (1.0 - bucket.tokens) / self.rate_per_s
            detail = (f"{participant_id} exceeded {self.rate_per_s:g} submissions/s (burst {self.burst}); "
                      f"retry in {wait:.1f}s")
            return Rejection(None, ErrorCode.RATE_LIMITED, detail, wait)
        bucket.tokens -= 1.0
        return None

    def charge_bytes(self, participant_id: str, round_key: Hashable, n_bytes: int) -> Rejection | None:
        """Charge `n_bytes` to the round's byte quota; the refusal, or None."""
        usage = self._usage.setdefault((participant_id, round_key), _Usage())
        if usage.bytes + n_bytes > self.quota_bytes:
            detail = (f"{participant_id} sent {usage.bytes} + {n_bytes} bytes this round > round_quota_bytes "
                      f"{self.quota_bytes}")
            return Rejection(None, ErrorCode.QUOTA_BYTES, detail, self._round_retry_s())
        usage.bytes += n_bytes
        return None

    def charge_trajectories(self, participant_id: str, round_key: Hashable, count: int) -> Rejection | None:
        """Charge `count` trajectories to the round's quota; the refusal, or None."""
        usage = self._usage.setdefault((participant_id, round_key), _Usage())
        if usage.trajectories + count > self.quota_trajectories:
            detail = (f"{participant_id} sent {usage.trajectories} + {count} trajectories this round > "
                      f"round_quota_trajectories {self.quota_trajectories}")
            return Rejection(None, ErrorCode.QUOTA_TRAJECTORIES, detail, self._round_retry_s())
        usage.trajectories += count
        return None

    def refill(self) -> None:
        """A new round: every participant's bucket is full again (see the module docstring)."""
        for bucket in self._buckets.values():
            bucket.tokens = float(self.burst)

    def forget_round(self, round_key: Hashable) -> None:
        """Drop the usage of a closed round (memory stays bounded over a long run)."""
        for key in [k for k in self._usage if k[1] == round_key]:
            del self._usage[key]
