"""Which rows of a HACPO update carry a gradient, and a minibatch's metrics when only those train.

A sample whose advantage is zero contributes exactly zero to every mode's policy objective
(`hacfed.algorithm`: each is A times a function of the ratio), so when no KL term is on it either
(docs/hacpo.md §5: the k3 KL covers own samples, and only when kl_coef > 0) its forward and
backward are work with nothing to learn. `hacfed.clients.update.hacpo_update` trains only on the
rows `carries_gradient` keeps, scaling their loss by their share of the minibatch's normaliser
(the same denominator as the full minibatch), and `whole_minibatch` reports the metrics the full
minibatch reports: its loss, its sample counts, its cross bound and the fraction of its cross
samples carrying gradient are the full minibatch's; the ratio and clip means cover the rows
trained on (a skipped row's ratio is never computed). A minibatch with no such row runs no
forward: its optimizer step sees zero gradients, as the full minibatch's would.

    live = carries_gradient(views, advantages, cfg, kl_on=reference is not None and cfg.kl_coef > 0)
    keep = kept_rows(live, slice(0, 8))      # None: every row trains; []: none does
"""

from __future__ import annotations

import math
from typing import Sequence

from torch import Tensor

from hacfed.algorithm import cross_clip_lower
from hacfed.hacpo_config import HacpoConfig
from hacfed.trajectory import TrainingView

__all__ = ["carries_gradient", "kept_rows", "normaliser", "whole_minibatch"]


def normaliser(views: Sequence[TrainingView], cfg: HacpoConfig) -> int:
    """What the minibatch loss of these rows is averaged over: the sequences the objective includes
    (gspo: own ones), or for grpo the ratio tokens (`ratio_mask` within the response)."""
    if cfg.mode == "grpo":
        return sum(min(v.ratio_token_count, len(v.response_ids)) for v in views)
    return sum(1 for v in views if v.is_self or cfg.mode != "gspo")


def carries_gradient(views: Sequence[TrainingView], advantages: Tensor, cfg: HacpoConfig, kl_on: bool) -> list[bool]:
    """Per row: whether its loss has a gradient (a non-zero advantage on a row the objective
    counts, or an own sample under the KL term)."""
    out = []
    for v, adv in zip(views, advantages.tolist()):
        counted = normaliser([v], cfg) > 0
        out.append((adv != 0 and counted) or (kl_on and v.is_self))
    return out


def kept_rows(live: Sequence[bool], minibatch: slice) -> list[int] | None:
    """The rows of `minibatch` that carry a gradient; None when all of them do."""
    rows = [i for i in range(minibatch.start, minibatch.stop) if live[i]]
    return None if len(rows) == minibatch.stop - minibatch.start else rows


def whole_minibatch(metrics: dict[str, float], trained: Sequence[TrainingView], views: Sequence[TrainingView],
                    m: int, cfg: HacpoConfig) -> dict[str, float]:
    """The metrics of minibatch m (`views`) from those of its `trained` rows (module docstring);
    `metrics` is {} when no row trained."""
    out = dict(metrics)
    total = normaliser(views, cfg)
    out["loss"] = metrics.get("loss", 0.0) * normaliser(trained, cfg) / total if total else 0.0
    own = sum(1 for v in views if v.is_self)
    cross = 0 if cfg.mode in ("gspo", "grpo") else len(views) - own
    out["num_self"], out["num_cross"] = float(own), float(cross)
    if cfg.mode == "grpo":
        out.setdefault("self_ratio_mean", math.nan)
        out.setdefault("self_clip_frac", math.nan)
        return out
    trained_cross = sum(1 for v in trained if not v.is_self)
    for key in ("self_ratio_mean", "cross_ratio_mean", "self_clip_frac", "cross_clip_frac"):
        out.setdefault(key, math.nan)
    carrying = metrics.get("cross_grad_frac", 0.0) * trained_cross if trained_cross else 0.0
    out["cross_grad_frac"] = carrying / cross if cross else math.nan
    out["cross_lower_bound"] = float(cross_clip_lower(m, cfg)) if cross else math.nan
    return out
