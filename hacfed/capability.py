"""Capability estimate P̂ and capability ratios (docs/hacpo.md §2). Torch-free: the coordinator uses it.

Federated difference from the authors' two-agent trainer: an agent absent from a step (a dropped
lab) keeps its history unchanged and the step does not fail; agents can be added later.
"""

from __future__ import annotations

import hashlib
import math
import unicodedata
from collections import deque
from typing import Callable, Iterable, Mapping, Sequence

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


# -- duplicate successes (the coordinator's `dedup_successes`; docs/security.md, "Duplicate successes") --

DEDUP_MIN_CHARS = 80  # a normalised response shorter than this is no evidence of copying (longer than
# every built-in task's worked solution: chain with 6 terms, 66 characters): never de-credited
DEDUP_MEMORY = 200_000  # the accepted successes a coordinator remembers, newest kept (`SuccessMemory`)


def normalise_response(text: str) -> str:
    """What two responses must share to count as one text: NFKC, case-folded, every run of
    whitespace one space, no leading or trailing space."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def response_key(prompt_id: str, text: str, min_chars: int = DEDUP_MIN_CHARS) -> bytes | None:
    """The key of `text` as an answer to `prompt_id` (16 bytes of a sha256), or None when its
    normalised form is shorter than `min_chars`: a short answer ("42") is what every lab that solves
    the prompt writes, so sharing it shows nothing."""
    normal = normalise_response(text)
    if len(normal) < min_chars:
        return None
    return hashlib.sha256(prompt_id.encode("utf-8") + b"\x00" + normal.encode("utf-8")).digest()[:16]


class SuccessMemory:
    """The last `size` accepted successes that have a key (`response_key`), oldest first, and for
    each key the lab of its earliest remembered acceptance (`owner`). Holding at most `size`
    entries is its bound (about 170 bytes each: 35 MB full); the oldest is forgotten first."""

    def __init__(self, size: int = DEDUP_MEMORY) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"success memory size must be an integer >= 1, got {size!r}")
        self.size = size
        self._order: deque[bytes] = deque()  # the keys of the remembered acceptances, oldest first
        # key -> the lab of its one remembered acceptance, or the labs of several, oldest first
        self._labs: dict[bytes, str | list[str]] = {}

    def __len__(self) -> int:
        return len(self._order)

    def owner(self, key: bytes) -> str | None:
        labs = self._labs.get(key)
        return labs if labs is None or isinstance(labs, str) else labs[0]

    def add(self, key: bytes, lab: str) -> None:
        self._order.append(key)
        labs = self._labs.get(key)
        if labs is None:
            self._labs[key] = lab
        elif isinstance(labs, str):
            self._labs[key] = [labs, lab]
        else:
            labs.append(lab)
        if len(self._order) > self.size:
            old = self._order.popleft()
            labs = self._labs[old]
            if isinstance(labs, str):
                del self._labs[old]
            else:
                del labs[0]
                if len(labs) == 1:
                    self._labs[old] = labs[0]


def credit_successes(
    samples: Sequence[tuple[str, str, str, float]], memory: SuccessMemory | None, min_chars: int = DEDUP_MIN_CHARS,
    fits: Callable[[str, float], bool] | None = None,
) -> tuple[list[float], list[tuple[bytes, str]]]:
    """The credited reward of each of one submission's accepted samples, given as (lab, prompt id,
    response text, verified reward), and the (key, lab) of its successes for `memory.add`, which the
    caller applies once the submission is committed (`memory` is only read here).

    A success (reward > 0) is credited its reward unless
    - `fits` (the coordinator's `format_gate`: `hacfed.response_format.ResponseFormat.fits`) refuses
      a sample of the same lab and prompt: a lab's inbound filter leaves such a group out whole, so
      none of its successes reaches a filtered learner, and none earns P̂ or reach; or
    - with `memory` (the coordinator's `dedup_successes`; None: off) its text has a key
      (`response_key`) and either an earlier sample of the same lab and prompt in this submission had
      the same key (a group of G copies counts once), or `memory` remembers the key from another lab
      first (a peer's text, from this round or an earlier one, replayed).
    A success that `fits` refuses itself is not remembered: text outside the format owns no key. A
    failure is credited as it is (its reward, at most 0)."""
    fit = [fits is None or fits(text, float(reward)) for _, _, text, reward in samples]
    refused = refused_groups(samples, fits, fit)
    credits: list[float] = []
    seen: set[bytes] = set()
    added: list[tuple[bytes, str]] = []
    for (lab, prompt_id, text, reward), ok in zip(samples, fit):
        reward = float(reward)
        gated = reward > 0 and (lab, prompt_id) in refused
        key = response_key(prompt_id, text, min_chars) if memory is not None and reward > 0 and ok else None
        if key is None or memory is None:
            credits.append(0.0 if gated else reward)
            continue
        owner = memory.owner(key)
        credits.append(0.0 if gated or key in seen or (owner is not None and owner != lab) else reward)
        seen.add(key)
        added.append((key, lab))
    return credits, added


def refused_groups(
    samples: Sequence[tuple[str, str, str, float]], fits: Callable[[str, float], bool] | None,
    fit: Sequence[bool] | None = None,
) -> set[tuple[str, str]]:
    """The (lab, prompt id) groups of one submission's samples, given as `credit_successes` takes
    them, that hold a sample `fits` refuses (none without `fits`); `fit`: each sample's verdict, when
    the caller has it already."""
    if fits is None:
        return set()
    if fit is None:
        fit = [fits(text, float(reward)) for _, _, text, reward in samples]
    return {(lab, prompt_id) for (lab, prompt_id, _, _), ok in zip(samples, fit) if not ok}
