"""One learner's HACPO update on a round's pool (docs/design.md "A lab's round", step 1).

Runs in a lab's hacfed-client process (and in `hacfed sim`), called by `hacfed.clients.training`.

    views  -> own samples first, then each other source in agent order
    A      -> hacpo_advantages over the whole pool with this learner as k
    for each minibatch m (m counts every minibatch of the step):
        mean log π over the ratio tokens -> hacpo_policy_loss(..., update_index=m)
        + kl_coef · k3 KL on own samples against the reference policy
        backward, clip grad norm, optimizer step

With `shards` (data-parallel ranks, `hacfed.clients.distributed`) every rank builds the same views
and advantages over the whole pool, scores its share of the old log-probs (all-gathered), and
computes each minibatch's loss on its contiguous row shard, rescaled to the minibatch's global
normalisation (sequences, tokens for grpo, own sequences for the KL) so that DDP's averaged
gradient is the one-process gradient; the metrics are recomputed from the gathered rows.
"""

from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

import torch
from torch import Tensor

from hacfed.algorithm import (
    HacpoConfig, capability_ratio, grpo_token_loss, hacpo_advantages, hacpo_policy_loss, kl_k3,
)
from hacfed.rollout.logprobs import sequence_logprobs
from hacfed.trajectory import TrainingView, Trajectory, build_training_view

if TYPE_CHECKING:
    from hacfed.clients.distributed import Shards

log = logging.getLogger("hacfed.clients.update")


@dataclass(frozen=True)
class UpdateSettings:
    minibatch_size: int
    max_grad_norm: float = 1.0
    max_prompt_len: int = 128
    max_response_len: int = 64

    def __post_init__(self) -> None:
        if self.minibatch_size < 1:
            raise ValueError(f"minibatch_size must be >= 1, got {self.minibatch_size!r}")
        if not self.max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be > 0, got {self.max_grad_norm!r}")


def order_pool(pool: Sequence[Trajectory], learner: str, agent_order: Sequence[str], cfg: HacpoConfig) -> list[Trajectory]:
    """Own samples first, then each other source in agent order (docs/hacpo.md §5); gspo drops others."""
    rank = {agent: i for i, agent in enumerate(agent_order)}
    own = [t for t in pool if t.source_id == learner]
    if cfg.mode in ("gspo", "grpo"):
        return own
    others = [t for t in pool if t.source_id != learner]
    others.sort(key=lambda t: (rank.get(t.source_id, len(rank)), t.source_id))  # stable inside a source
    return own + others


def build_views(
    pool: Sequence[Trajectory], learner: str, tokenizer: Any, settings: UpdateSettings
) -> tuple[list[TrainingView], int]:
    """Views of every sample; returns (views, skipped).

    Nothing is truncated: a truncated response would make the learner's mean cover a prefix while
    the source's summary covers the whole response. Another agent's sample that does not fit (or
    re-tokenizes to nothing) is left out and counted; an own sample that does not fit is a
    configuration error (max_response_len below the plan's max_new_tokens) and raises.
    """
    views: list[TrainingView] = []
    skipped = 0
    for t in pool:
        try:
            views.append(build_training_view(
                t, learner, tokenizer, settings.max_prompt_len, settings.max_response_len, overflow="error"
            ))
        except ValueError as exc:
            if t.source_id == learner:
                raise ValueError(f"own sample cannot be trained on: {exc}") from exc
            log.warning("learner %s skips %s's sample %s: %s", learner, t.source_id, t.trajectory_id, exc)
            skipped += 1
    return views, skipped


def default_minibatch(pool: Sequence[Trajectory]) -> int:
    """The paper's minibatch: half of one agent's samples of the step (prompts × G / 2), so each
    source fills two minibatches. Derived from the pool, which every lab receives identically, so
    the stepwise schedule L_m agrees across labs."""
    per_group: dict[tuple[str, str], int] = {}
    for t in pool:
        key = (t.prompt_id, t.source_id)
        per_group[key] = per_group.get(key, 0) + 1
    prompts = {p for p, _ in per_group}
    group_size = max(per_group.values(), default=0)
    return max(1, len(prompts) * group_size // 2)


def mean_logp_over_ratio_tokens(logp: Tensor, views: Sequence[TrainingView]) -> Tensor:
    """(B, T) per-token log-probs -> (B,) mean over each view's first `ratio_token_count` tokens."""
    counts = torch.tensor([v.ratio_token_count for v in views], device=logp.device)
    positions = torch.arange(logp.shape[1], device=logp.device).unsqueeze(0)  # (1, T)
    ratio_mask = (positions < counts.unsqueeze(1)).to(logp.dtype)  # (B, T)
    return (logp * ratio_mask).sum(dim=1) / counts.to(logp.dtype)


def hacpo_update(
    model: Any,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    reference: Callable[[], contextlib.AbstractContextManager[Any]] | None,
    pool: Sequence[Trajectory],
    learner: str,
    agent_order: Sequence[str],
    capabilities: Mapping[str, float],
    cfg: HacpoConfig,
    settings: UpdateSettings,
    shards: Shards | None = None,
) -> dict[str, float]:
    """Train `model` on `pool` with learner `learner`. Returns averaged metrics.

    `reference()` is a context manager yielding the reference model for the KL term (for LoRA:
    the same model with the adapter disabled); None or kl_coef == 0 skips the KL. `shards`: this
    rank's part of a data-parallel update (module docstring); every rank must call with the same pool.
    """
    ordered = order_pool(pool, learner, agent_order, cfg)
    views, skipped = build_views(ordered, learner, tokenizer, settings)
    if not views:
        return {"num_samples": 0.0, "skipped_views": float(skipped)}
    rewards = torch.tensor([v.reward for v in views], dtype=torch.float32)
    advantages = hacpo_advantages(
        rewards, [v.prompt_id for v in views], [v.source_id for v in views], learner, capabilities, cfg
    )
    omega = torch.tensor(
        [capability_ratio(capabilities, v.source_id, learner, cfg) for v in views], dtype=torch.float32
    )
    pad_id = tokenizer.pad_token_id
    device = next(model.parameters()).device
    # Own samples: the old log-prob is recomputed with the training forward (not taken from the
    # rollout engine, whose kernels may differ), so own ratios start at exactly 1. EOS-only samples
    # of other agents have no source summary and use the learner's own old log-prob too; so do all
    # of them in mode "sapo", which treats peers' text as the learner's own samples.
    # Minibatch 0 trains on the pre-update policy, so in one process its training forward (detached)
    # gives those old log-probs: only the later minibatches are scored ahead (ranks score all rows).
    in_loop = min(settings.minibatch_size, len(views)) if shards is None else 0
    deferred = [i for i in range(in_loop) if _needs_own_old(views[i], learner, cfg)]
    old_tokens = _old_token_logps(model, views, pad_id, learner, cfg, shards, skip=in_loop)
    by_bytes = torch.tensor([_per_byte(v, learner, cfg) for v in views], dtype=torch.bool)
    source_norm = _source_norms(views, old_tokens, by_bytes, pending=set(deferred))
    use_kl = reference is not None and cfg.kl_coef > 0

    trainee = shards.wrap(model) if shards is not None else model  # DDP averages the gradients
    model.train()
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    cross_log: list[tuple[str, float, float, bool]] = []  # (source, ratio, advantage, carries gradient)
    for m, start in enumerate(range(0, len(views), settings.minibatch_size)):
        full = views[start:start + settings.minibatch_size]
        # This rank's rows [lo, hi) of the minibatch (all of it in one process). A rank without
        # rows still runs one forward and backward, scaled by 0, because DDP reduces in backward.
        lo, hi = shards.bounds(len(full)) if shards is not None else (0, len(full))
        first = start + (lo if hi > lo else 0)
        idx = slice(first, first + max(hi - lo, 1))
        batch = views[idx]
        logp, mask = sequence_logprobs(trainee, [v.prompt_ids for v in batch], [v.response_ids for v in batch], pad_id)
        is_self = torch.tensor([v.is_self for v in batch], dtype=torch.bool, device=device)
        if m == 0:  # the deferred rows are rows of this minibatch (one process: idx starts at 0)
            for i in deferred:
                old_tokens[i] = logp[i, : views[i].ratio_token_count].detach().float().cpu()
        if cfg.mode == "grpo":
            old = _pad_rows([old_tokens[i] for i in range(idx.start, idx.stop)], logp.shape[1], device)
            ratio_mask = _ratio_mask(logp, batch) * mask
            loss, metrics = grpo_token_loss(logp, old, ratio_mask, advantages[idx].to(device), cfg)
            local_count = float(ratio_mask.sum())  # DAPO's token-level normalisation
        else:
            learner_norm = _learner_norms(logp, batch, by_bytes[idx].to(device))  # (b,)
            if m == 0 and deferred:  # the same token mean _source_norms takes: own ratios exactly 1
                source_norm[deferred] = learner_norm.detach().cpu()[deferred]
            loss, metrics = hacpo_policy_loss(
                learner_norm, source_norm[idx].to(device), advantages[idx].to(device), is_self,
                omega[idx].to(device), m, cfg,
            )
            local_count = float(len(batch))  # sequence-level mean (order_pool left only included samples)
        kl_part = None
        if use_kl and bool(is_self.any()):
            own = is_self.nonzero().squeeze(1)
            with torch.no_grad(), reference() as ref_model:
                ref_logp, _ = sequence_logprobs(
                    ref_model, [batch[i].prompt_ids for i in own.tolist()], [batch[i].response_ids for i in own.tolist()], pad_id
                )
            width = ref_logp.shape[1]  # the longest own response; wider columns are masked for own rows
            kl_part = kl_k3(logp[own][:, :width], ref_logp.to(device), mask[own][:, :width])
        if shards is None:
            if cfg.mode != "grpo":
                cross_log.extend(_cross_diagnostics(batch, learner_norm, source_norm[idx], advantages[idx], m, cfg))
            if kl_part is not None:
                loss = loss + cfg.kl_coef * kl_part
                metrics["kl"] = float(kl_part.detach())
        else:
            loss, metrics = _shard_loss(
                shards, cfg, m, full, start, hi > lo, loss, metrics, local_count,
                learner_norm.detach().cpu() if cfg.mode != "grpo" else None, kl_part,
                int(is_self.sum()) if hi > lo else 0, source_norm, advantages, omega, cross_log,
            )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), settings.max_grad_norm)
        optimizer.step()
        metrics["grad_norm"] = float(grad_norm)
        for key, value in metrics.items():
            if isinstance(value, float) and math.isfinite(value):
                sums[key] = sums.get(key, 0.0) + value
                counts[key] = counts.get(key, 0) + 1
    out = {k: sums[k] / counts[k] for k in sums}
    own_adv = advantages[[v.is_self for v in views]]
    out.update(
        num_samples=float(len(views)),
        num_updates=float(m + 1),
        adv_mean=float(advantages.mean()),
        adv_abs_mean=float(advantages.abs().mean()),
        own_adv_abs_mean=float(own_adv.abs().mean()) if own_adv.numel() else 0.0,
        skipped_views=float(skipped),
    )
    out.update(summarize_cross(cross_log))
    model.eval()
    return out


def _shard_loss(shards: Shards, cfg: HacpoConfig, m: int, full: Sequence[TrainingView], start: int, has_rows: bool,
                loss: Tensor, metrics: dict[str, float], local_count: float, learner_norm: Tensor | None,
                kl_part: Tensor | None, own_local: int, source_norm: Tensor, advantages: Tensor, omega: Tensor,
                cross_log: list) -> tuple[Tensor, dict[str, float]]:
    """One rank's loss of a data-parallel minibatch, scaled to the global normalisation, and the
    minibatch's metrics as one process computes them (from every rank's gathered rows)."""
    from hacfed.clients.distributed import global_scale

    if not has_rows:
        local_count, own_local, kl_part = 0.0, 0, None
        learner_norm = learner_norm[:0] if learner_norm is not None else None
    kl_sum = float(kl_part.detach()) * own_local if kl_part is not None else 0.0
    parts = shards.all_gather((local_count, learner_norm, kl_sum, own_local, metrics if has_rows else None,
                               kl_part is not None))
    global_count = sum(p[0] for p in parts)
    own_global = sum(p[3] for p in parts)
    scaled = loss * global_scale(local_count, global_count, shards.world)
    if kl_part is not None:
        scaled = scaled + cfg.kl_coef * kl_part * global_scale(own_local, own_global, shards.world)
    idx = slice(start, start + len(full))
    if cfg.mode == "grpo":  # token-weighted means of each rank's token-level metrics
        out = {"num_self": sum(p[4]["num_self"] for p in parts if p[4]), "num_cross": 0.0}
        for key in ("loss", "self_ratio_mean", "self_clip_frac"):
            out[key] = sum(p[4][key] * p[0] for p in parts if p[4]) / global_count
    else:
        full_norm = torch.cat([p[1] for p in parts])
        is_self = torch.tensor([v.is_self for v in full], dtype=torch.bool)
        _, out = hacpo_policy_loss(full_norm, source_norm[idx], advantages[idx], is_self, omega[idx], m, cfg)
        cross_log.extend(_cross_diagnostics(full, full_norm, source_norm[idx], advantages[idx], m, cfg))
    if any(p[5] for p in parts):  # the minibatch has own samples and the KL is on
        out["kl"] = sum(p[2] for p in parts) / own_global
    return scaled, out


def _per_byte(view: TrainingView, learner: str, cfg: HacpoConfig) -> bool:
    """xhacpo's tokenizer-invariant ratio applies to cross samples with a source summary."""
    return (
        cfg.cross_ratio_unit == "byte" and view.source_id != learner
        and view.source_mean_logp is not None and view.text_bytes > 0
    )


def _needs_own_old(view: TrainingView, learner: str, cfg: HacpoConfig) -> bool:
    return view.source_id == learner or view.source_mean_logp is None or cfg.mode == "sapo"


def _old_token_logps(model: Any, views: Sequence[TrainingView], pad_id: int, learner: str,
                     cfg: HacpoConfig, shards: Shards | None = None, skip: int = 0) -> list[Tensor | None]:
    """Per view, the learner's current (pre-update) log-probs of its ratio tokens, where needed;
    with `shards` each rank scores its share and the shares are all-gathered. The first `skip`
    views are left None (the caller scores them in its first training forward)."""
    out: list[Tensor | None] = [None] * len(views)
    wanted = [i for i, v in enumerate(views) if i >= skip and _needs_own_old(v, learner, cfg)]
    if shards is not None:
        lo, hi = shards.bounds(len(wanted))
        mine = _old_token_logps(model, [views[i] for i in wanted[lo:hi]], pad_id, learner, cfg) if hi > lo else []
        for part in shards.all_gather([(wanted[lo + j], t) for j, t in enumerate(mine)]):
            for i, t in part:
                out[i] = t
        return out
    with torch.no_grad():
        for start in range(0, len(wanted), 256):
            chunk = wanted[start:start + 256]
            sub = [views[i] for i in chunk]
            logp, _ = sequence_logprobs(model, [v.prompt_ids for v in sub], [v.response_ids for v in sub], pad_id)
            for row, i in enumerate(chunk):
                out[i] = logp[row, : views[i].ratio_token_count].float().cpu()
    return out


def _source_norms(views: Sequence[TrainingView], old_tokens: Sequence[Tensor | None], by_bytes: Tensor,
                  pending: set[int] = frozenset()) -> Tensor:
    """(N,) the "old" side of each sample's sequence log-ratio, in the unit the ratio uses; rows in
    `pending` are NaN until the caller fills them."""
    out = torch.empty(len(views))
    for i, v in enumerate(views):
        if i in pending:
            out[i] = math.nan
        elif old_tokens[i] is not None:
            out[i] = old_tokens[i].mean()
        elif bool(by_bytes[i]):
            out[i] = v.source_logp_sum / v.text_bytes
        else:
            out[i] = v.source_mean_logp
    return out


def _ratio_mask(logp: Tensor, views: Sequence[TrainingView]) -> Tensor:
    counts = torch.tensor([v.ratio_token_count for v in views], device=logp.device)
    positions = torch.arange(logp.shape[1], device=logp.device).unsqueeze(0)  # (1, T)
    return (positions < counts.unsqueeze(1)).to(logp.dtype)  # (B, T)


def _learner_norms(logp: Tensor, views: Sequence[TrainingView], by_bytes: Tensor) -> Tensor:
    """(B,) the learner's side of the log-ratio: token mean, or sum per byte of text for xhacpo."""
    summed = (logp * _ratio_mask(logp, views)).sum(dim=1)  # (B,)
    counts = torch.tensor([v.ratio_token_count for v in views], device=logp.device, dtype=logp.dtype)
    text_bytes = torch.tensor([max(v.text_bytes, 1) for v in views], device=logp.device, dtype=logp.dtype)
    return torch.where(by_bytes, summed / text_bytes, summed / counts)


def _pad_rows(rows: Sequence[Tensor | None], width: int, device: torch.device) -> Tensor:
    out = torch.zeros((len(rows), width))
    for i, row in enumerate(rows):
        if row is None:
            raise ValueError("grpo needs the learner's old log-probs of every sample")
        out[i, : row.shape[0]] = row
    return out.to(device)


def _cross_diagnostics(batch, learner_norm, source_norm, advantages, update_index, cfg):
    """(source, ratio s, advantage, carries gradient) of each cross sample, as the loss saw it."""
    from hacfed.algorithm import cross_clip_lower

    lower = cross_clip_lower(update_index, cfg)
    s = torch.exp(torch.clamp(learner_norm.detach().cpu() - source_norm, -cfg.max_abs_log_ratio, cfg.max_abs_log_ratio))
    rows = []
    for v, ratio, adv in zip(batch, s.tolist(), advantages.tolist()):
        if v.is_self:
            continue
        rows.append((v.source_id, ratio, adv, _carries(ratio, adv, lower, cfg)))
    return rows


def _carries(s: float, adv: float, lower: float, cfg: HacpoConfig) -> bool:
    if adv == 0:
        return False
    if cfg.mode in ("hacpo", "xhacpo"):
        if cfg.cross_negatives == "skip" and adv < 0:
            return False
        if not cfg.cross_clip or lower <= s <= 1.0:
            return True
        return cfg.cross_clip_style == "pessimistic" and adv > 0 and s < lower
    low, high = 1.0 - cfg.self_clip_low, 1.0 + cfg.self_clip_high
    if low <= s <= high:
        return True
    if adv > 0:
        return s < low  # min(s·A, clip(s)·A) keeps s·A below the window
    return cfg.mode != "naive" and s > high  # naive's dual clip holds negative samples above it


def summarize_cross(rows: Sequence[tuple[str, float, float, bool]]) -> dict[str, float]:
    """Per source: ratio quantiles, the fraction carrying gradient, and the advantage sign of those."""
    out: dict[str, float] = {}
    by_source: dict[str, list[tuple[float, float, bool]]] = {}
    for source, s, adv, carries in rows:
        by_source.setdefault(source, []).append((s, adv, carries))
    for source, items in by_source.items():
        ratios = sorted(s for s, _, _ in items)
        for q in (0.1, 0.5, 0.9):
            out[f"cross/{source}/ratio_p{int(q * 100)}"] = ratios[min(len(ratios) - 1, int(q * len(ratios)))]
        signed = [(s, adv) for s, adv, _ in items if adv != 0]
        if signed:
            out[f"cross/{source}/pos_frac"] = sum(adv > 0 for _, adv in signed) / len(signed)
            for name, keep in (("pos", lambda a: a > 0), ("neg", lambda a: a < 0)):
                values = sorted(s for s, adv in signed if keep(adv))
                if values:
                    out[f"cross/{source}/ratio_p50_{name}"] = values[len(values) // 2]
        carrying = [adv for _, adv, c in items if c]
        out[f"cross/{source}/grad_frac"] = len(carrying) / len(items)
        if carrying:
            out[f"cross/{source}/grad_pos_frac"] = sum(a > 0 for a in carrying) / len(carrying)
    return out


@contextlib.contextmanager
def frozen_copy_reference(ref_model: Any) -> Iterator[Any]:
    yield ref_model


@contextlib.contextmanager
def adapter_disabled_reference(peft_model: Any) -> Iterator[Any]:
    with peft_model.disable_adapter():
        yield peft_model
