"""Learner-side rules for a partner's sample (docs/partner_rules.md), xhacpo's options.

Runs inside one learner's update (`hacfed.clients.update.hacpo_update`), before advantages: a
partner sample a rule rejects leaves the learner's batch as if it had not been sent, so it neither
carries gradient nor moves the group baseline. Each rule reads only what the lab holds itself: the
coordinator's verified rewards in the pool and the learner's own log-probs, never a source's
claimed log-prob.

  rescue ........ a partner's samples of a prompt count only where the learner's own group mean
                  reward is <= `rescue_max_own_reward` (0.0: only where every own sample failed)
  likelihood .... a partner sample whose per-byte probability under the learner,
                  exp(Σ log π_k(y) / bytes(y)), is below `partner_min_byte_prob` is left out
  trust ......... counted here, learned in `hacfed.clients.trust`: per partner, the prompts where
                  the learner fell short and the partner answered ("short"), and those of them
                  where a kept sample of the partner scored above the learner's own group mean
                  ("useful"); `trust_factors` scales each partner's ω by the lab's trust in it

    views, selection = select_partner_views(views, "lab-a", cfg, {3: -0.4, 4: -2.9})
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import torch
from torch import Tensor

from hacfed.hacpo_config import HacpoConfig
from hacfed.trajectory import TrainingView

__all__ = ["PartnerCounts", "PartnerSelection", "rules_active", "select_partner_views", "trust_factors",
           "counts_from_metrics"]

_PREFIX = "partner/"


def rules_active(cfg: HacpoConfig) -> bool:
    """Whether any learner-side rule is on (trust needs the counts even when nothing is left out)."""
    return cfg.mode == "xhacpo" and (
        cfg.rescue_max_own_reward < 1.0 or cfg.partner_min_byte_prob > 0 or cfg.trust_rate > 0
    )


@dataclass
class PartnerCounts:
    """One partner's samples in one update, as the rules saw them."""

    offered: int = 0  # its samples the learner could read
    not_short: int = 0  # left out by rescue: the learner's own group did well enough on the prompt
    improbable: int = 0  # left out by the likelihood rule
    kept: int = 0
    short_prompts: int = 0  # prompts where the learner fell short and this partner answered
    useful_prompts: int = 0  # of those, where a kept sample of it scored above the learner's own mean


@dataclass
class PartnerSelection:
    """What the rules kept: `keep[i]` for each view, and the counts per partner."""

    keep: list[bool]
    counts: dict[str, PartnerCounts] = field(default_factory=dict)

    def metrics(self, carrying: Mapping[str, int]) -> dict[str, float]:
        """Metrics of the update: the share of partner samples kept and carrying gradient, overall
        and per partner, and the per-partner prompt counts the trust update reads
        (`counts_from_metrics`). `carrying`: per partner, its kept samples that carried gradient."""
        offered = sum(c.offered for c in self.counts.values())
        out: dict[str, float] = {}
        if offered:
            out["partner/kept_frac"] = sum(c.kept for c in self.counts.values()) / offered
            out["partner/grad_frac"] = sum(carrying.get(p, 0) for p in self.counts) / offered
        for partner, c in self.counts.items():
            key = f"{_PREFIX}{partner}/"
            if c.offered:
                out[key + "kept_frac"] = c.kept / c.offered
                out[key + "grad_frac"] = carrying.get(partner, 0) / c.offered
                out[key + "not_short_frac"] = c.not_short / c.offered
                out[key + "improbable_frac"] = c.improbable / c.offered
            out[key + "short_prompts"] = float(c.short_prompts)
            out[key + "useful_prompts"] = float(c.useful_prompts)
        return out


def counts_from_metrics(metrics: Mapping[str, float]) -> dict[str, tuple[int, int]]:
    """{partner: (short_prompts, useful_prompts)} read back from an update's metrics."""
    out: dict[str, tuple[int, int]] = {}
    for key, value in metrics.items():
        if key.startswith(_PREFIX) and key.endswith("/short_prompts"):
            partner = key[len(_PREFIX):-len("/short_prompts")]
            out[partner] = (int(value), int(metrics.get(f"{_PREFIX}{partner}/useful_prompts", 0)))
    return out


def select_partner_views(
    views: Sequence[TrainingView], learner: str, cfg: HacpoConfig, learner_bytes_logp: Mapping[int, float]
) -> tuple[list[TrainingView], PartnerSelection]:
    """The views the rules keep (every own view, the partner views that pass), and the selection.

    learner_bytes_logp: {i: the learner's log-prob per UTF-8 byte of views[i]'s text}, for the
    partner views the likelihood rule judges (a view without one passes it: an empty text).
    """
    own_rewards: dict[object, list[float]] = {}
    for v in views:
        if v.source_id == learner:
            own_rewards.setdefault(v.prompt_id, []).append(v.reward)
    own_mean = {p: math.fsum(r) / len(r) for p, r in own_rewards.items()}
    floor = math.log(cfg.partner_min_byte_prob) if cfg.partner_min_byte_prob > 0 else -math.inf
    keep: list[bool] = []
    counts: dict[str, PartnerCounts] = {}
    short_by: dict[str, set] = {}
    useful_by: dict[str, set] = {}
    for i, v in enumerate(views):
        if v.source_id == learner:
            keep.append(True)
            continue
        c = counts.setdefault(v.source_id, PartnerCounts())
        c.offered += 1
        mean = own_mean.get(v.prompt_id, 0.0)  # a prompt without own samples: the learner has nothing
        if mean < 1.0 and mean <= cfg.rescue_max_own_reward:
            short_by.setdefault(v.source_id, set()).add(v.prompt_id)
        if mean > cfg.rescue_max_own_reward:
            c.not_short += 1
            keep.append(False)
        elif learner_bytes_logp.get(i, math.inf) < floor:
            c.improbable += 1
            keep.append(False)
        else:
            c.kept += 1
            keep.append(True)
            if mean < 1.0 and v.reward > mean:
                useful_by.setdefault(v.source_id, set()).add(v.prompt_id)
    for partner, c in counts.items():
        c.short_prompts = len(short_by.get(partner, ()))
        c.useful_prompts = len(useful_by.get(partner, ()))
    return [v for v, k in zip(views, keep) if k], PartnerSelection(keep, counts)


def trust_factors(views: Sequence[TrainingView], trust: Mapping[str, float]) -> Tensor:
    """(N,) float32: each partner view's trust weight (1 for a partner without one), 1 for own views."""
    return torch.tensor([1.0 if v.is_self else float(trust.get(v.source_id, 1.0)) for v in views],
                        dtype=torch.float32)
