"""Capability estimate P̂ and capability ratios (docs/hacpo.md §2). Torch-free: the coordinator uses it.

Federated difference from the authors' two-agent trainer: an agent absent from a step (a dropped
lab) keeps its history unchanged and the step does not fail; agents can be added later.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Iterable, Mapping, Sequence

from hacfed.hacpo_config import HacpoConfig


def capability_ratio(
    capabilities: Mapping[str, float], source: str, learner: str, cfg: HacpoConfig
) -> float:
    """ratio(source, learner) = clip(P̂_source / P̂_learner, ratio_min, ratio_max) (Eq. 10); 1.0 when equal."""
    if source == learner:
        return 1.0
    for name in (source, learner):
        if name not in capabilities:
            raise ValueError(f"no capability estimate for agent {name!r}; known: {sorted(capabilities)}")
        value = capabilities[name]
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(f"capability of agent {name!r} must be a finite number > 0, got {value!r}")
    ratio = capabilities[source] / capabilities[learner]
    return float(min(max(ratio, cfg.ratio_min), cfg.ratio_max))


class CapabilityTracker:
    """Sliding-window estimate P̂_j = mean of the last K per-step success rates, floored at `minimum`.

    `update` is called once per step with all rewards of the step, before any policy update.
    An agent with no history has P̂ = 1.0.
    """

    def __init__(self, agent_ids: Iterable[str], window: int = 5, minimum: float = 1e-8) -> None:
        if not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be an integer >= 1, got {window!r}")
        if not (math.isfinite(minimum) and minimum > 0):
            raise ValueError(f"minimum must be a finite number > 0, got {minimum!r}")
        self.window = window
        self.minimum = float(minimum)
        self._history: dict[str, deque[float]] = {}
        for agent in agent_ids:
            self.add_agent(agent)

    @property
    def agent_ids(self) -> tuple[str, ...]:
        return tuple(self._history)

    def add_agent(self, agent_id: str) -> None:
        if not isinstance(agent_id, str) or not agent_id:
            raise ValueError(f"agent id must be a non-empty string, got {agent_id!r}")
        if agent_id in self._history:
            raise ValueError(f"agent {agent_id!r} is already tracked")
        self._history[agent_id] = deque(maxlen=self.window)

    def update(self, rewards: Sequence[float], source_ids: Sequence[str]) -> dict[str, float]:
        """Append P_j = mean(reward > 0) for every agent present in this step; return P̂ for all."""
        rewards = [float(r) for r in rewards]
        source_ids = list(source_ids)
        if len(rewards) != len(source_ids):
            raise ValueError(f"rewards ({len(rewards)}) and source_ids ({len(source_ids)}) differ in length")
        bad = [r for r in rewards if not math.isfinite(r)]
        if bad:
            raise ValueError(f"rewards must be finite, got {bad[0]!r}")
        unknown = sorted({s for s in source_ids if s not in self._history})
        if unknown:
            raise ValueError(f"unknown agent(s) {unknown}; add them with add_agent() first")
        hits: dict[str, list[int]] = {}
        for r, s in zip(rewards, source_ids):
            hits.setdefault(s, []).append(1 if r > 0 else 0)
        for agent, values in hits.items():
            self._history[agent].append(sum(values) / len(values))
        return self.capabilities()

    def capabilities(self) -> dict[str, float]:
        out = {}
        for agent, hist in self._history.items():
            out[agent] = max(sum(hist) / len(hist), self.minimum) if hist else 1.0
        return out

    def state_dict(self) -> dict:
        return {
            "window": self.window,
            "minimum": self.minimum,
            "history": {agent: list(hist) for agent, hist in self._history.items()},
        }

    def load_state_dict(self, state: Mapping) -> None:
        if int(state["window"]) != self.window:
            raise ValueError(f"state window {state['window']!r} != tracker window {self.window}")
        history = state["history"]
        self.minimum = float(state["minimum"])
        self._history = {}
        for agent, values in history.items():
            self.add_agent(agent)
            for v in values:
                v = float(v)
                if not (0.0 <= v <= 1.0):
                    raise ValueError(f"history value for {agent!r} must be in [0, 1], got {v!r}")
                self._history[agent].append(v)

    @classmethod
    def from_config(cls, agent_ids: Iterable[str], cfg: HacpoConfig) -> "CapabilityTracker":
        return cls(agent_ids, window=cfg.capability_window)
