"""`hostile:lie-logprob` for `hacfed sim`: an honest lab's samples with the most damaging log-prob claims.

The lab rolls out and trains as an honest one (a real `Participant`); only the source log-prob summary of
each sample it sends is replaced. A peer's summary enters a learner's update only through the sequence
ratio s = exp(clamp(x − c, ±max_abs_log_ratio)), x the learner's side of the sample (its mean log-prob
per token, or per byte for xhacpo's `cross_ratio_unit = "byte"`), c the claim in the same unit
(docs/hacpo.md §5). How much the learner's gradient moves towards the sample is d obj / d x, which
`hacfed.algorithm.hacpo_policy_loss` gives: for a success (A > 0) it grows with s up to an upper edge
(1 for HACPO's and xhacpo's cross window, 1 + ε_high for naive's own-sample clip, e^max_abs_log_ratio
where nothing clips) and is zero beyond it. The liar therefore reads the learners' policies (in the
simulator it can: the worst case of a lab that knows its peers' public models), computes each honest
learner's x of each sample as it stands before that learner trains on the round's pool, and claims the
c that maximizes the summed weight d obj / d x over the learners, evaluated with the real loss at the
plan's `HacpoConfig` on the first minibatch (L_0 = 1 − δ), among the c that put some learner at an upper
edge and the bounds the coordinator accepts (sum ≤ 0, per-token mean ≥ min_mean_logp). Modes whose
learners never read a peer's summary (gspo, gspo2, grpo, sapo) get the honest summary.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import torch

from hacfed.hacpo_config import HacpoConfig
from hacfed.messages import RoundUpdate, Submission
from hacfed.trajectory import Trajectory

SUMMARY_MODES = ("hacpo", "xhacpo", "naive")  # the modes whose learners read a peer's summary
MARGIN = 1e-4  # log-ratio kept inside an edge, so the learner's own rounding cannot push s past it


def claim_weights(sides: torch.Tensor, claims: torch.Tensor, cfg: HacpoConfig) -> torch.Tensor:
    """(K, C): d obj / d x of a cross sample with A = +1, ω = 1, on minibatch 0, for learner side sides[k] and
    claim claims[c] (the real `hacpo_policy_loss`)."""
    from hacfed.algorithm import hacpo_policy_loss

    k, c = sides.numel(), claims.numel()
    lp = sides.reshape(k, 1).expand(k, c).reshape(-1).clone().float().requires_grad_(True)
    src = claims.reshape(1, c).expand(k, c).reshape(-1).float()
    b = lp.numel()
    loss = hacpo_policy_loss(lp, src, torch.ones(b), torch.zeros(b, dtype=torch.bool), torch.ones(b), 0, cfg).loss
    loss.backward()
    return (-lp.grad * b).reshape(k, c)


def best_claim(sides: Sequence[float], cfg: HacpoConfig, low: float) -> float | None:
    """The claim (in the ratio's unit) in [low, 0] with the most summed weight over the learners' sides;
    None when no claim gives any weight (or there is no learner)."""
    if not sides:
        return None
    edges = [0.0, math.log1p(cfg.self_clip_high), cfg.max_abs_log_ratio]
    candidates = sorted({min(max(x - e + MARGIN, low), 0.0) for x in sides for e in edges} | {low, 0.0})
    weights = claim_weights(torch.tensor(sides), torch.tensor(candidates), cfg).sum(dim=0)
    best = int(torch.argmax(weights))
    return candidates[best] if float(weights[best]) > 0 else None


def learner_sides(trajectories: Sequence[Trajectory], learner: Any, by_byte: bool) -> list[float | None]:
    """Each sample's ratio side under `learner` (a Participant) as it stands: mean log-prob per ratio token,
    or sum per UTF-8 byte; None where the learner cannot read the sample (too long, no tokens)."""
    from hacfed.clients.sequence_ratio import score_old_logps
    from hacfed.trajectory import build_training_view

    views, at = [], []
    for i, t in enumerate(trajectories):
        try:
            view = build_training_view(t, learner.participant_id, learner.tokenizer, learner.cfg.max_prompt_len,
                                       learner.cfg.max_response_len, overflow="error")
        except ValueError:
            continue
        if view.ratio_token_count > 0 and (view.text_bytes > 0 or not by_byte):
            views.append(view)
            at.append(i)
    out: list[float | None] = [None] * len(trajectories)
    if not views:
        return out
    scored = score_old_logps(learner.model, views, list(range(len(views))), learner.tokenizer.pad_token_id)
    for j, (i, view) in enumerate(zip(at, views)):
        total = float(scored[j].sum())
        out[i] = total / view.text_bytes if by_byte else total / view.ratio_token_count
    return out


def lie(t: Trajectory, sides: Sequence[float], cfg: HacpoConfig, min_mean_logp: float) -> Trajectory:
    """`t` with the summary of `best_claim` (unchanged for an EOS-only sample or where nothing gives weight)."""
    n = t.source_token_count
    if n == 0:
        return t
    by_byte = cfg.cross_ratio_unit == "byte" and bool(t.response_text)
    unit = len(t.response_text.encode("utf-8")) if by_byte else n
    claim = best_claim(list(sides), cfg, min_mean_logp * n / unit)
    if claim is None:
        return t
    # Within the coordinator's bounds after rounding too: sum <= 0, sum / n >= min_mean_logp.
    total = min(max(claim * unit, min_mean_logp * n * (1 - 1e-9)), 0.0)
    return dataclasses.replace(t, source_logp_sum=float(total))


class LogprobLiar:
    """An honest participant whose submissions carry `lie`'s summaries against `learners`."""

    def __init__(self, inner: Any, learners: Sequence[Any], min_mean_logp: float) -> None:
        self.inner = inner
        self.learners = list(learners)
        self.min_mean_logp = min_mean_logp
        self.participant_id = inner.participant_id

    def step(self, update: RoundUpdate) -> Submission:
        submission = self.inner.step(update)
        plan = update.next_plan
        if plan is None or plan.hacpo.mode not in SUMMARY_MODES or not submission.trajectories:
            return submission
        cfg = plan.hacpo
        trajectories = submission.trajectories
        per_learner = [learner_sides(trajectories, p, cfg.cross_ratio_unit == "byte") for p in self.learners]
        lied = []
        for i, t in enumerate(trajectories):
            sides = [s[i] for s in per_learner if s[i] is not None]
            lied.append(lie(t, sides, cfg, self.min_mean_logp))
        return dataclasses.replace(submission, trajectories=tuple(lied))
