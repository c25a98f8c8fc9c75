"""HACPO math: pure functions on torch tensors (Zhang et al., arXiv 2603.02604; docs/hacpo.md).

One function per mechanism, no model, tokenizer, I/O or global state:
  - capability estimate P̂ and ratios ........ `CapabilityTracker`, `capability_ratio` (§2, Eq. 10)
  - Mechanism 1, capability-aware advantage .. `hacpo_advantages` (§3, Eqs. 6-8)
  - Mechanisms 2-4, the policy objective ..... `hacpo_policy_loss` (§4-§5, Eq. 10 and the GSPO ratio)
  - stepwise clipping bound .................. `cross_clip_lower` (§5)
  - KL regulariser on own samples ............ `kl_k3` (§5)

Everything generalises the paper's two agents to any number n of agents; groups are keyed by
prompt id and hold every agent's samples for that prompt.
"""

from __future__ import annotations

import math
from typing import Mapping, NamedTuple, Sequence

import torch
from torch import Tensor

from hacfed.capability import CapabilityTracker, capability_ratio
from hacfed.hacpo_config import HACPO_FAMILY, HacpoConfig

__all__ = [
    "HacpoConfig",
    "CapabilityTracker",
    "capability_ratio",
    "hacpo_advantages",
    "cross_clip_lower",
    "hacpo_policy_loss",
    "PolicyLoss",
    "SampleFlags",
    "grpo_token_loss",
    "kl_k3",
]


def hacpo_advantages(
    rewards: Tensor,
    prompt_ids: Sequence,
    source_ids: Sequence[str],
    learner: str,
    capabilities: Mapping[str, float],
    cfg: HacpoConfig,
) -> Tensor:
    """Advantages of every sample for learner k (docs/hacpo.md §3, Eqs. 6-8).

    rewards: (N,) raw rewards; prompt_ids / source_ids: length N. Per prompt group:
      - all rewards identical -> every advantage 0 (uniform-reward guard);
      - baseline μ_k = mean_i(w_i · r_i), w_i = 1 / ratio(source_i, k) (1 for own samples);
        if μ_k > reward_max (binary guard) -> mean of the learner's own rewards in the group;
      - A_i = (r_i − μ_k) / (std(r) + eps), std = unbiased std of the group's raw rewards
        (a one-sample group uses std = 1).
    modes "naive" and "sapo": plain pooled mean/std over all samples (no weights). modes "gspo"
    and "grpo": only the learner's own samples form the group; other samples get advantage 0.
    `capability_baseline=False` (ablation "-Adv") uses w_i = 1.

    hacfed extension (not in the paper, where the learner always has own samples): if the binary
    guard fires in a group without own samples (the learner's submission was lost), the
    unweighted group mean is used.
    """
    rewards = _as_1d_float(rewards, "rewards")
    n = rewards.shape[0]
    if len(prompt_ids) != n or len(source_ids) != n:
        raise ValueError(
            f"rewards ({n}), prompt_ids ({len(prompt_ids)}) and source_ids ({len(source_ids)}) differ in length"
        )
    out = torch.zeros_like(rewards)
    groups: dict[object, list[int]] = {}
    for i, pid in enumerate(prompt_ids):
        groups.setdefault(pid, []).append(i)
    use_weights = cfg.mode in HACPO_FAMILY and cfg.capability_baseline
    own_only = cfg.mode in ("gspo", "grpo")
    for members in groups.values():
        if own_only:
            members = [i for i in members if source_ids[i] == learner]
            if not members:
                continue
        idx = torch.tensor(members, dtype=torch.long)
        r = rewards[idx]  # (n_g,)
        if bool((r == r[0]).all()):
            continue  # uniform-reward guard: A = 0
        own = torch.tensor([source_ids[i] == learner for i in members], dtype=torch.bool)
        if use_weights:
            w = torch.tensor(
                [1.0 / capability_ratio(capabilities, source_ids[i], learner, cfg) for i in members],
                dtype=rewards.dtype,
            )
            baseline = (w * r).mean()
            if baseline > cfg.reward_max:  # binary guard
                baseline = r[own].mean() if bool(own.any()) else r.mean()
        else:
            baseline = r.mean()
        std = r.std(unbiased=True) if r.numel() > 1 else torch.ones((), dtype=rewards.dtype)
        out[idx] = (r - baseline) / (std + cfg.adv_eps)
    return out


def cross_clip_lower(update_index: int, cfg: HacpoConfig) -> float:
    """Stepwise lower bound L_m = min(1, 1 − δ + m·δ_step) for the m-th minibatch update (§5).

    With `stepwise_clip=False` (ablation) the bound stays at the static 1 − δ.
    """
    if isinstance(update_index, bool) or not isinstance(update_index, int) or update_index < 0:
        raise ValueError(f"update_index must be an int >= 0, got {update_index!r}")
    if not cfg.stepwise_clip:
        return 1.0 - cfg.cross_clip_delta
    return min(1.0, 1.0 - cfg.cross_clip_delta + update_index * cfg.cross_clip_step)


class SampleFlags(NamedTuple):
    """Per-sample facts of one minibatch's objective, all (B,) and detached.

    ratio: the sequence ratio s. clipped: s lies outside the window of its objective.
    carries: obj_i depends on the policy, so sample i contributes a gradient (the one definition of
    "carries gradient": the update's per-source diagnostics read it from here)."""

    ratio: Tensor
    clipped: Tensor
    carries: Tensor


class PolicyLoss(NamedTuple):
    loss: Tensor
    metrics: dict[str, float]
    flags: SampleFlags


def hacpo_policy_loss(
    learner_mean_logp: Tensor,
    source_mean_logp: Tensor,
    advantages: Tensor,
    is_self: Tensor,
    capability_ratios: Tensor,
    update_index: int,
    cfg: HacpoConfig,
) -> PolicyLoss:
    """The HACPO objective for one minibatch (docs/hacpo.md §4-§5). All inputs are (B,).

    learner_mean_logp: token-mean log-prob of each response under the current learner (grad flows).
    source_mean_logp: the source's old per-token mean (= sum / count of the summary), no grad.
    Sequence ratio s = exp(clamp(learner − source, ±max_abs_log_ratio)).
      own samples:   obj = min(s·A, clip(s, 1 − ε_low, 1 + ε_high)·A)            (GSPO)
      cross samples: c = clip(s, L_m, 1);  obj = c · sg(c)^α · ω · A               (Mech. 2-4)
                     ω = capability_ratios (ratio(source, learner)); L_m = cross_clip_lower(m).
    mode "naive": every sample uses the own-sample (GSPO) objective against its source log-prob.
    mode "gspo": cross samples are dropped. Loss = −mean over included sequences of obj.
    Returns (loss, metrics, flags): `SampleFlags` says per sample what the objective did.
    """
    lp, src, adv, omega = _check_loss_inputs(
        learner_mean_logp, source_mean_logp, advantages, is_self, capability_ratios
    )
    lower = cross_clip_lower(update_index, cfg)

    log_ratio = torch.clamp(lp - src.detach(), -cfg.max_abs_log_ratio, cfg.max_abs_log_ratio)
    s = torch.exp(log_ratio)  # (B,)
    self_style = is_self if cfg.mode in HACPO_FAMILY else torch.ones_like(is_self)
    include = is_self if cfg.mode in ("gspo", "grpo") else torch.ones_like(is_self)
    if not bool(include.any()):
        raise ValueError(f"no sample left in the minibatch (mode {cfg.mode!r} with no own samples)")
    obj = torch.where(self_style, _self_objective(s, adv, is_self, cfg), _cross_objective(s, adv, omega, lower, cfg))
    weight = include.to(obj.dtype)
    loss = -(obj * weight).sum() / weight.sum()

    with torch.no_grad():
        unclamped = (lp - src).abs() <= cfg.max_abs_log_ratio  # the clamp passes no gradient beyond
        flags = _sample_flags(s, adv, is_self, self_style, include & unclamped, lower, cfg)
        own = include & is_self
        cross = include & ~is_self
        metrics = {
            "loss": float(loss.detach()),
            "self_ratio_mean": _masked_mean(s, own),
            "cross_ratio_mean": _masked_mean(s, cross),
            "self_clip_frac": _masked_mean(flags.clipped.to(s.dtype), own),
            "cross_clip_frac": _masked_mean(flags.clipped.to(s.dtype), cross),
            "cross_grad_frac": _masked_mean(flags.carries.to(s.dtype), cross),
            # Only where the bound applied: a minibatch without cross samples has none.
            "cross_lower_bound": float(lower) if bool(cross.any()) else math.nan,
            "num_self": float(own.sum()),
            "num_cross": float(cross.sum()),
        }
    return PolicyLoss(loss, metrics, flags)


def _self_objective(s: Tensor, adv: Tensor, is_self: Tensor, cfg: HacpoConfig) -> Tensor:
    """min(s·A, clip(s, 1 − ε_low, 1 + ε_high)·A): own samples (GSPO), and naive's and sapo's
    objective for every sample."""
    s_clipped = torch.clamp(s, 1.0 - cfg.self_clip_low, 1.0 + cfg.self_clip_high)
    obj = torch.minimum(s * adv, s_clipped * adv)
    if cfg.mode == "naive":
        # A cross sample's source log-prob is a peer's claim: bound its weight like an own
        # sample's (dual clip), so a forged low claim cannot scale a negative-advantage gradient
        # (min(s·A, ...) alone is unbounded in s when A < 0). Own samples are unchanged.
        bounded = torch.where(adv < 0, torch.maximum(obj, (1.0 + cfg.self_clip_high) * adv), obj)
        obj = torch.where(is_self, obj, bounded)
    return obj


def _cross_objective(s: Tensor, adv: Tensor, omega: Tensor, lower: float, cfg: HacpoConfig) -> Tensor:
    """Mechanisms 2-4 for another agent's sample: c · sg(c)^α · ω · A with c = clip(s, L_m, 1)."""
    c = torch.clamp(s, lower, 1.0) if cfg.cross_clip else s
    coef = omega if cfg.capability_coefficient else torch.ones_like(omega)
    base = c
    if cfg.cross_clip_style == "pessimistic" and cfg.cross_clip:
        # xhacpo: PPO's pessimistic bound with HACPO's window. A positive-advantage sample below
        # the window keeps its gradient at importance weight s (the learner still moves towards a
        # peer's success it finds unlikely); everything else is exactly the paper's clip.
        base = torch.where((adv > 0) & (s < lower), s, c)
    obj = base * c.detach().pow(cfg.alpha) * coef.detach() * adv
    if cfg.cross_negatives == "skip":
        # xhacpo: a peer's failure is not pushed down (see docs); only its successes teach.
        obj = torch.where(adv > 0, obj, obj.detach())
    return obj


def _sample_flags(s: Tensor, adv: Tensor, is_self: Tensor, self_style: Tensor, live: Tensor, lower: float,
                  cfg: HacpoConfig) -> SampleFlags:
    """Which window each sample's s falls outside of, and whether its objective depends on θ
    (`live`: the sample is in the loss and its log-ratio was not clamped)."""
    low, high = 1.0 - cfg.self_clip_low, 1.0 + cfg.self_clip_high
    outside_self = (s < low) | (s > high)
    # min(s·A, clip(s)·A) is s·A inside the window, below it when A > 0, above it when A < 0.
    self_carries = ~outside_self | ((adv > 0) & (s < low)) | ((adv < 0) & (s > high))
    if cfg.mode == "naive":  # the dual clip holds a cross sample with A < 0 above the window
        self_carries = self_carries & (is_self | ~((adv < 0) & (s > high)))
    if cfg.cross_clip:
        outside_cross = (s < lower) | (s > 1.0)
    else:
        outside_cross = torch.zeros_like(is_self)
    cross_carries = ~outside_cross
    if cfg.cross_clip_style == "pessimistic" and cfg.cross_clip:
        cross_carries = cross_carries | ((adv > 0) & (s < lower))
    if cfg.cross_negatives == "skip":
        cross_carries = cross_carries & (adv > 0)
    clipped = torch.where(self_style, outside_self, outside_cross)
    carries = torch.where(self_style, self_carries, cross_carries) & live & (adv != 0)
    return SampleFlags(s.detach(), clipped, carries)


def _check_loss_inputs(learner_mean_logp: Tensor, source_mean_logp: Tensor, advantages: Tensor, is_self: Tensor,
                       capability_ratios: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    lp = _as_1d_float(learner_mean_logp, "learner_mean_logp")
    src = _as_1d_float(source_mean_logp, "source_mean_logp")
    adv = _as_1d_float(advantages, "advantages")
    omega = _as_1d_float(capability_ratios, "capability_ratios")
    if not isinstance(is_self, Tensor) or is_self.dtype != torch.bool or is_self.dim() != 1:
        raise ValueError(f"is_self must be a 1-D bool tensor, got {is_self!r}")
    b = lp.shape[0]
    for name, t in (("source_mean_logp", src), ("advantages", adv), ("is_self", is_self), ("capability_ratios", omega)):
        if t.shape[0] != b:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected ({b},) like learner_mean_logp")
    if b == 0:
        raise ValueError("empty minibatch: learner_mean_logp has 0 elements")
    if bool((omega <= 0).any()):
        raise ValueError(f"capability_ratios must be > 0, got min {omega.min().item()!r}")
    return lp, src, adv, omega


def grpo_token_loss(
    logp: Tensor, old_logp: Tensor, mask: Tensor, advantages: Tensor, cfg: HacpoConfig
) -> tuple[Tensor, dict[str, float]]:
    """GRPO with DAPO's clip-higher (docs/hacpo.md §7): token-level ratios, own samples only.

    logp, old_logp, mask: (B, T); advantages: (B,). r_t = exp(logp_t − old_t);
    obj_t = min(r_t·A, clip(r_t, 1 − ε_low, 1 + ε_high)·A) with ε = grpo_clip_low / grpo_clip_high
    (0.2 / 0.28); loss = −(sum of obj_t over every unmasked token) / (number of such tokens), DAPO's
    token-level aggregation.
    """
    if logp.shape != old_logp.shape or logp.shape != mask.shape or logp.dim() != 2:
        raise ValueError(
            f"logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)} and mask {tuple(mask.shape)} "
            "must all be the same (B, T) shape"
        )
    adv = _as_1d_float(advantages, "advantages")
    if adv.shape[0] != logp.shape[0]:
        raise ValueError(f"advantages has shape {tuple(adv.shape)}, expected ({logp.shape[0]},)")
    m = mask.to(logp.dtype)
    if not bool(m.sum() > 0):
        raise ValueError("grpo_token_loss: no unmasked token")
    log_ratio = torch.clamp(logp - old_logp.detach(), -cfg.max_abs_log_ratio, cfg.max_abs_log_ratio)
    r = torch.exp(log_ratio)  # (B, T)
    a = adv.unsqueeze(1)  # (B, 1)
    obj = torch.minimum(r * a, torch.clamp(r, 1.0 - cfg.grpo_clip_low, 1.0 + cfg.grpo_clip_high) * a)
    loss = -(obj * m).sum() / m.sum()
    with torch.no_grad():
        outside = ((r < 1.0 - cfg.grpo_clip_low) | (r > 1.0 + cfg.grpo_clip_high)).to(m.dtype)
        metrics = {
            "loss": float(loss.detach()),
            "self_ratio_mean": float((r * m).sum() / m.sum()),
            "self_clip_frac": float((outside * m).sum() / m.sum()),
            "num_self": float(logp.shape[0]),
            "num_cross": 0.0,
        }
    return loss, metrics


def kl_k3(logp: Tensor, ref_logp: Tensor, mask: Tensor) -> Tensor:
    """Low-variance KL(π‖π_ref) estimator k3 = exp(ref − logp) − (ref − logp) − 1 (Schulman).

    logp, ref_logp, mask: (B, T). Token-mean inside each sequence, mean over sequences (the same
    aggregation as the policy loss). The log difference is clamped to ±20 for numerical safety.
    Applied to the learner's own samples only (docs/hacpo.md §5).
    """
    if logp.shape != ref_logp.shape or logp.shape != mask.shape or logp.dim() != 2:
        raise ValueError(
            f"logp {tuple(logp.shape)}, ref_logp {tuple(ref_logp.shape)} and mask {tuple(mask.shape)} "
            "must all be the same (B, T) shape"
        )
    m = mask.to(logp.dtype)
    counts = m.sum(dim=1)
    if bool((counts <= 0).any()):
        raise ValueError("kl_k3: every sequence needs at least one unmasked token")
    diff = torch.clamp(ref_logp.detach() - logp, -20.0, 20.0) * m  # (B, T)
    k3 = (torch.exp(diff) - diff - 1.0) * m  # (B, T)
    return (k3.sum(dim=1) / counts).mean()


def _as_1d_float(t: Tensor, name: str) -> Tensor:
    if not isinstance(t, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
    if not t.is_floating_point():
        raise ValueError(f"{name} must be floating point, got dtype {t.dtype}")
    if not bool(torch.isfinite(t).all()):
        bad = t[~torch.isfinite(t)][0].item()
        raise ValueError(f"{name} must be finite, got {bad!r}")
    return t


def _masked_mean(values: Tensor, mask: Tensor) -> float:
    if not bool(mask.any()):
        return math.nan
    return float(values[mask].mean())
