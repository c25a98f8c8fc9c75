"""One learner's HACPO update on a round's pool (docs/design.md "A lab's round", step 1).

Runs in a lab's hacfed-client process (and in `hacfed sim`), called by `hacfed.clients.training`.
`hacpo_update` reads like the paper (docs/hacpo.md §2-§5):

    views  -> own samples first, then each other source in agent order
    A      -> hacpo_advantages over the whole pool with this learner as k       (Mechanism 1)
    ω      -> ratio(source, learner) = clip(P̂_source / P̂_learner, 0.1, 10)     (Mechanism 2)
    old    -> each ratio's old side: the source's summary, or the learner's own (sequence_ratio)
    for each minibatch m (m counts every minibatch of the step):
        mean log π over the ratio tokens -> hacpo_policy_loss(..., update_index=m)  (Mechanisms 3-4)
        + kl_coef · k3 KL on own samples against the reference policy
        backward, clip grad norm, optimizer step

Where a minibatch's rows are computed is the `RowSplit` it is handed: all in this process
(`OneProcess`, the default) or split over a lab's data-parallel ranks
(`hacfed.clients.update_parallel.DataParallel`). Where a process's rows of a minibatch hold more
padded tokens than the lab's `microbatch_tokens`, their forward/backward runs in microbatches within
that budget (`hacfed.clients.microbatch`), each loss weighted by its share of the minibatch's
normalisation (included sequences; tokens for grpo; own sequences for the KL), so the accumulated
gradient, the optimizer step and the metrics are the one-pass ones up to float rounding.
"""

from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, Sequence

import torch
from torch import Tensor

from hacfed.algorithm import HacpoConfig, capability_ratio, grpo_token_loss, hacpo_advantages, hacpo_policy_loss, kl_k3
from hacfed.clients.microbatch import split_rows
from hacfed.clients.no_grad_rows import carries_gradient, kept_rows, normaliser, whole_minibatch
from hacfed.clients.partner_rules import rules_active, select_partner_views, trust_factors
from hacfed.clients.sequence_ratio import (
    OldSide,
    learner_norms,
    needs_own_old,
    old_side,
    pad_rows,
    per_byte,
    ratio_mask,
    score_old_logps,
)
from hacfed.clients.update_metrics import CrossRow, UpdateLog, cross_rows
from hacfed.rollout.logprobs import sequence_logprobs
from hacfed.trajectory import TrainingView, Trajectory, build_training_view

__all__ = ["order_pool", "build_views", "default_minibatch", "hacpo_update", "OneProcess", "RowSplit"]

log = logging.getLogger("hacfed.clients.update")
Reference = Callable[[], contextlib.AbstractContextManager[Any]]


def order_pool(
    pool: Sequence[Trajectory], learner: str, agent_order: Sequence[str], cfg: HacpoConfig
) -> list[Trajectory]:
    """Own samples first, then each other source in agent order (docs/hacpo.md §5); gspo drops others."""
    rank = {agent: i for i, agent in enumerate(agent_order)}
    own = [t for t in pool if t.source_id == learner]
    if cfg.mode in ("gspo", "grpo"):
        return own
    others = [t for t in pool if t.source_id != learner]
    others.sort(key=lambda t: (rank.get(t.source_id, len(rank)), t.source_id))  # stable inside a source
    return own + others


def build_views(
    pool: Sequence[Trajectory], learner: str, tokenizer: Any, max_prompt_len: int, max_response_len: int
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
                t, learner, tokenizer, max_prompt_len, max_response_len, overflow="error"
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


@dataclass
class LearnerBatch:
    """Every sample of the step in training order, with what each minibatch's loss reads."""

    views: list[TrainingView]
    advantages: Tensor  # (N,) Mechanism 1
    omega: Tensor  # (N,) ratio(source, learner), 1 for own samples
    by_bytes: Tensor  # (N,) bool: xhacpo's per-byte ratio
    old: OldSide  # the old side of each ratio
    temperature: float = 1.0  # every log-prob of the update is of the policy tempered at the rollouts' T

    def rows(self, keep: Sequence[int]) -> LearnerBatch:
        """Rows `keep` as a batch of their own, renumbered from 0 (minibatch 0's pending rows stay
        pending, to be filled by the forward that trains on them)."""
        return LearnerBatch([self.views[i] for i in keep], self.advantages[keep], self.omega[keep],
                            self.by_bytes[keep], self.old.rows(keep), self.temperature)


@dataclass
class MinibatchPart:
    """One minibatch's loss over the rows this process computed."""

    has_rows: bool
    loss: Tensor  # policy loss, normalised over these rows
    metrics: dict[str, float]
    count: float  # its normaliser: sequences (tokens for grpo)
    num_own: int
    learner_norm: Tensor | None  # (b,) the learner's side of each ratio; None for grpo
    kl: Tensor | None  # k3 KL over these rows' own samples; None without own samples or KL
    cross: list[CrossRow]


class RowSplit(Protocol):
    """Where each step of the update runs: `OneProcess`, or `update_parallel.DataParallel`."""

    defers_first_minibatch: bool
    skips_no_grad: bool  # trains only the rows that carry a gradient (`hacfed.clients.no_grad_rows`)
    world: int  # processes whose gradients are averaged (DDP's mean); 1 in one process

    def wrap(self, model: Any) -> Any: ...
    def score_old(
        self, model: Any, views: Sequence[TrainingView], wanted: Sequence[int], pad_id: int, temperature: float = 1.0
    ) -> dict[int, Tensor]: ...
    def local_rows(self, start: int, size: int) -> tuple[slice, bool]: ...
    def microbatches(self, views: Sequence[TrainingView], start: int) -> list[slice] | None: ...
    def no_sync(self, trainee: Any) -> contextlib.AbstractContextManager[Any]: ...
    def combine(self, part: MinibatchPart, m: int, minibatch: slice, batch: LearnerBatch,
                cfg: HacpoConfig) -> tuple[Tensor, dict[str, float], list[CrossRow]]: ...


class OneProcess:
    """Every row in this process.

    Minibatch 0 trains on the pre-update policy, so its own training forward, detached, gives the
    old log-probs of its rows that need the learner's (`sequence_ratio.needs_own_old`): only later
    minibatches' are scored ahead. Kept because it is measurable and free: on a two-agent pool of
    256 samples (tiny-llama learner, 16 prompts × G 8) an update took a median 0.607 CPU-s against
    0.637 scoring every row ahead (5 % less), with bitwise the same parameters and metrics."""

    defers_first_minibatch = True
    skips_no_grad = True
    world = 1

    def __init__(self, token_budget: int | None = None) -> None:
        self.token_budget = token_budget  # padded tokens per forward; None: a minibatch in one pass

    def wrap(self, model: Any) -> Any:
        return model

    def score_old(
        self, model: Any, views: Sequence[TrainingView], wanted: Sequence[int], pad_id: int, temperature: float = 1.0
    ) -> dict[int, Tensor]:
        return score_old_logps(model, views, wanted, pad_id, self.token_budget, temperature)

    def local_rows(self, start: int, size: int) -> tuple[slice, bool]:
        return slice(start, start + size), True

    def microbatches(self, views: Sequence[TrainingView], start: int) -> list[slice] | None:
        """The minibatch's rows (`views`, the first at `start`) as microbatches within the token
        budget, or None when it fits in one pass."""
        return token_slices(views, start, self.token_budget)

    def no_sync(self, trainee: Any) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def combine(self, part: MinibatchPart, m: int, minibatch: slice, batch: LearnerBatch,
                cfg: HacpoConfig) -> tuple[Tensor, dict[str, float], list[CrossRow]]:
        """The minibatch's loss (its KL term added) and metrics, as computed."""
        loss, metrics = part.loss, part.metrics
        if part.kl is not None:
            loss = loss + cfg.kl_coef * part.kl
            metrics["kl"] = float(part.kl.detach())
        return loss, metrics, part.cross


def token_slices(views: Sequence[TrainingView], start: int, token_budget: int | None) -> list[slice] | None:
    """Rows `views` (the first at index `start`) as consecutive slices within `token_budget` padded
    tokens (`hacfed.clients.microbatch.split_rows`); None when one pass fits or there is no budget."""
    if token_budget is None:
        return None
    groups = split_rows([len(v.prompt_ids) for v in views], [len(v.response_ids) for v in views], token_budget)
    return [slice(start + g[0], start + g[-1] + 1) for g in groups] if len(groups) > 1 else None


def hacpo_update(
    model: Any,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    reference: Reference | None,
    pool: Sequence[Trajectory],
    learner: str,
    agent_order: Sequence[str],
    capabilities: Mapping[str, float],
    cfg: HacpoConfig,
    *,
    minibatch_size: int,
    max_grad_norm: float,
    max_prompt_len: int,
    max_response_len: int,
    split: RowSplit | None = None,
    microbatch_tokens: int | None = None,
    temperature: float = 1.0,
    trust: Mapping[str, float] | None = None,
    skip_no_grad: bool = True,
) -> dict[str, float]:
    """Train `model` on `pool` with learner `learner`. Returns averaged metrics.

    `reference()` is a context manager yielding the reference model for the KL term (for LoRA:
    the same model with the adapter disabled); None or kl_coef == 0 skips the KL. The lab's own
    settings (the minibatch size, the gradient clip, the longest prompt and response it trains on)
    come checked from its ParticipantConfig (`hacfed.clients.training`). `split`: where the
    minibatches' rows are computed (module docstring); every data-parallel rank calls with the same pool.
    `microbatch_tokens`: the most padded tokens one training forward holds (the default split's).
    `temperature`: the rollouts' sampling temperature T; the learner's, the own old and the
    reference log-probs are all of the policy tempered at T, like the sources' summaries.
    `trust`: the lab's weight of each partner (`hacfed.clients.trust`), scaling that partner's ω
    when `cfg.trust_rate` > 0. The learner-side rules of `hacfed.clients.partner_rules` leave out
    the partner samples they reject before anything else sees the pool.
    `skip_no_grad`: run no forward or backward for the samples whose loss has no gradient
    (`hacfed.clients.no_grad_rows`; in one process only), reported as `skipped_no_grad` and
    `skipped_no_grad_frac`; the parameters after the update are the same to float rounding.
    """
    split = split if split is not None else OneProcess(microbatch_tokens)
    # The learner's batch: own samples first, then each other source in agent order (§5).
    views, skipped = build_views(order_pool(pool, learner, agent_order, cfg), learner, tokenizer, max_prompt_len,
                                 max_response_len)
    selection = None
    if views and rules_active(cfg):
        views, selection = select_partner_views(views, learner, cfg, _learner_bytes_logp(
            model, tokenizer.pad_token_id, views, learner, cfg, split, temperature))
    if not views:
        return {"num_samples": 0.0, "skipped_views": float(skipped)}
    advantages, omega = _advantages_and_omega(views, learner, capabilities, cfg, trust)
    # The old side of each ratio (§5): a peer's sample against its source's summary, an own sample
    # against the learner's pre-update log-probs, scored before the first optimizer step.
    kl_on = reference is not None and cfg.kl_coef > 0
    live = (carries_gradient(views, advantages, cfg, kl_on) if skip_no_grad and split.skips_no_grad
            else [True] * len(views))
    batch = _learner_batch(model, tokenizer.pad_token_id, views, advantages, omega, learner, cfg, minibatch_size,
                           split, temperature, live)

    update_log = _run_minibatches(model, optimizer, reference, batch, live, len(views), minibatch_size,
                                  max_grad_norm, tokenizer.pad_token_id, cfg, split)
    out = update_log.summary(views, advantages, skipped)
    out["skipped_no_grad"] = float(live.count(False))
    out["skipped_no_grad_frac"] = live.count(False) / len(views)
    if selection is not None:
        out.update(selection.metrics(update_log.carrying_cross()))
    return out


def _advantages_and_omega(views: Sequence[TrainingView], learner: str, capabilities: Mapping[str, float],
                          cfg: HacpoConfig, trust: Mapping[str, float] | None) -> tuple[Tensor, Tensor]:
    """Each sample's advantage and its ω (the cross-agent weight, scaled by the lab's trust in its source)."""
    # Mechanism 1 (§3): every sample judged against this learner's capability-weighted group baseline.
    rewards = torch.tensor([v.reward for v in views], dtype=torch.float32)
    advantages = hacpo_advantages(
        rewards, [v.prompt_id for v in views], [v.source_id for v in views], learner, capabilities, cfg
    )
    # Mechanism 2 (§4): each cross sample's objective is scaled by ω = ratio(source, learner).
    omega = torch.tensor(
        [capability_ratio(capabilities, v.source_id, learner, cfg) for v in views], dtype=torch.float32
    )
    if trust is not None and cfg.trust_rate > 0:  # the lab's own trust in each partner scales its ω
        omega = omega * trust_factors(views, trust)
    return advantages, omega


def _run_minibatches(model: Any, optimizer: torch.optim.Optimizer, reference: Reference | None, batch: LearnerBatch,
                     live: Sequence[bool], count: int, minibatch_size: int, max_grad_norm: float, pad_id: int,
                     cfg: HacpoConfig, split: RowSplit) -> UpdateLog:
    """One optimizer step per minibatch of the batch's `count` rows, only the `live` rows run forward."""
    trainee = split.wrap(model)
    model.train()
    update_log = UpdateLog()
    for m, start in enumerate(range(0, count, minibatch_size)):
        minibatch = slice(start, min(start + minibatch_size, count))
        optimizer.zero_grad(set_to_none=True)
        keep = kept_rows(live, minibatch)
        if keep is None:
            metrics, cross = _train_minibatch(trainee, reference, m, minibatch, batch, pad_id, cfg, split)
        else:
            metrics, cross = _train_rows(model, trainee, reference, m, minibatch, keep, batch, pad_id, cfg, split)
        metrics["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm))
        optimizer.step()
        update_log.add(metrics, cross)
    model.eval()
    return update_log


def _learner_batch(model: Any, pad_id: int, views: list[TrainingView], advantages: Tensor, omega: Tensor,
                   learner: str, cfg: HacpoConfig, minibatch_size: int, split: RowSplit,
                   temperature: float, live: Sequence[bool]) -> LearnerBatch:
    """The batch of the update; the learner's old log-probs are scored for the rows that train."""
    need_own = [i for i, v in enumerate(views) if needs_own_old(v, learner, cfg) and live[i]]
    first = min(minibatch_size, len(views)) if split.defers_first_minibatch else 0
    pending = [i for i in need_own if i < first]  # filled by minibatch 0's forward (`OneProcess`)
    scored = split.score_old(model, views, [i for i in need_own if i >= first], pad_id, temperature)
    by_bytes = torch.tensor([per_byte(v, learner, cfg) for v in views], dtype=torch.bool)
    untrained = [i for i, keep in enumerate(live) if not keep]
    return LearnerBatch(views, advantages, omega, by_bytes, old_side(views, scored, by_bytes, pending, untrained),
                        temperature)


def _learner_bytes_logp(model: Any, pad_id: int, views: Sequence[TrainingView], learner: str, cfg: HacpoConfig,
                        split: RowSplit, temperature: float) -> dict[int, float]:
    """{i: the pre-update learner's log-prob per UTF-8 byte of each partner sample's text}, for the
    likelihood rule (`partner_rules`); {} when that rule is off."""
    if cfg.partner_min_byte_prob <= 0:
        return {}
    wanted = [i for i, v in enumerate(views) if v.source_id != learner and v.text_bytes > 0]
    scored = split.score_old(model, views, wanted, pad_id, temperature)
    return {i: float(scored[i].sum()) / views[i].text_bytes for i in wanted}


def _train_minibatch(trainee: Any, reference: Reference | None, m: int, minibatch: slice, batch: LearnerBatch,
                     pad_id: int, cfg: HacpoConfig, split: RowSplit,
                     total: int | None = None) -> tuple[dict[str, float], list[CrossRow]]:
    """Minibatch m's forward and backward (gradients left for the optimizer); its metrics and cross
    rows. `total`: the normaliser of the loss when these rows are part of a larger minibatch."""
    micro = split.microbatches(batch.views[minibatch], minibatch.start)
    if micro is not None:  # the same loss and gradient, accumulated over microbatches within the token budget
        return _accumulate(trainee, reference, m, minibatch, micro, batch, pad_id, cfg, split, total)
    # Mechanisms 3-4 (§5): the loss of minibatch m, with the stepwise bound L_m.
    part = _minibatch_loss(trainee, reference, m, split.local_rows(minibatch.start, minibatch.stop - minibatch.start),
                           batch, pad_id, cfg)
    if total is not None:
        part.loss = part.loss * (part.count / total)
    loss, metrics, cross = split.combine(part, m, minibatch, batch, cfg)
    loss.backward()
    return metrics, cross


def _train_rows(model: Any, trainee: Any, reference: Reference | None, m: int, minibatch: slice, keep: list[int],
                batch: LearnerBatch, pad_id: int, cfg: HacpoConfig,
                split: RowSplit) -> tuple[dict[str, float], list[CrossRow]]:
    """Minibatch m trained on its rows `keep` alone (the others' loss has no gradient): their loss
    over the whole minibatch's normaliser, and the whole minibatch's metrics (`no_grad_rows`).
    With no row kept, no forward runs and the optimizer step sees zero gradients."""
    views = batch.views[minibatch]
    trained = [batch.views[i] for i in keep]
    metrics: dict[str, float] = {}
    cross: list[CrossRow] = []
    if keep:
        sub = batch.rows(keep)
        metrics, cross = _train_minibatch(trainee, reference, m, slice(0, len(keep)), sub, pad_id, cfg, split,
                                          total=normaliser(views, cfg))
    else:
        for p in model.parameters():
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
    kept = set(keep)
    cross += [CrossRow(v.source_id, math.nan, 0.0, False) for i, v in enumerate(views, minibatch.start)
              if i not in kept and not v.is_self and cfg.mode not in ("gspo", "grpo")]
    return whole_minibatch(metrics, trained, views, m, cfg), cross


def _minibatch_loss(trainee: Any, reference: Reference | None, m: int, mine: tuple[slice, bool],
                    batch: LearnerBatch, pad_id: int, cfg: HacpoConfig) -> MinibatchPart:
    """The loss of minibatch m over this process's rows `mine` (slice, whether it has any)."""
    idx, has_rows = mine
    views = batch.views[idx]
    logp, mask = sequence_logprobs(trainee, [v.prompt_ids for v in views], [v.response_ids for v in views], pad_id,
                                   batch.temperature)
    device = logp.device
    is_self = torch.tensor([v.is_self for v in views], dtype=torch.bool, device=device)
    adv = batch.advantages[idx]
    norm, cross = None, []
    if cfg.mode == "grpo":
        if m == 0:
            batch.old.fill_pending(batch.views, logp, None, idx.start)
        token_mask = ratio_mask(logp, views) * mask
        old = pad_rows(batch.old.tokens[idx], logp.shape[1], device)
        loss, metrics = grpo_token_loss(logp, old, token_mask, adv.to(device), cfg)
        count = float(token_mask.sum())  # DAPO's token-level normalisation
    else:
        norm = learner_norms(logp, views, batch.by_bytes[idx].to(device))  # (b,)
        if m == 0:
            batch.old.fill_pending(batch.views, logp, norm, idx.start)
        loss, metrics, flags = hacpo_policy_loss(
            norm, batch.old.norm[idx].to(device), adv.to(device), is_self, batch.omega[idx].to(device), m, cfg
        )
        count = float(len(views))  # sequence-level mean (order_pool left only included samples)
        cross = cross_rows(views, adv, flags)
    kl = None
    if reference is not None and cfg.kl_coef > 0 and bool(is_self.any()):
        kl = _own_kl(reference, logp, mask, is_self, views, pad_id, batch.temperature)
    return MinibatchPart(has_rows, loss, metrics, count, int(is_self.sum()), norm, kl, cross)


def _accumulate(trainee: Any, reference: Reference | None, m: int, minibatch: slice, micro: Sequence[slice],
                batch: LearnerBatch, pad_id: int, cfg: HacpoConfig, split: RowSplit,
                total: int | None = None) -> tuple[dict[str, float], list[CrossRow]]:
    """Minibatch m's forward/backward over `micro`, this process's rows of it in microbatches: each
    loss weighted by its share of the minibatch's normalisation (x the ranks DDP averages over), so
    the gradients add up to the one-pass gradient. Returns the minibatch's metrics and cross rows as
    one pass computes them. Under DDP every backward but the last skips the all-reduce, and the last
    comes after `combine`, in the same order of collectives as a rank that runs one pass. `total`:
    the normaliser when these rows are part of a larger minibatch (`_train_rows`)."""
    views, span = batch.views[minibatch], slice(micro[0].start, micro[-1].stop)  # this process's rows
    total, own_total = total or normaliser(views, cfg), sum(v.is_self for v in views)
    micro = [rows for rows in micro if normaliser(batch.views[rows], cfg) > 0]  # grpo: EOS-only rows add nothing
    parts: list[MinibatchPart] = []
    last: Tensor | None = None
    for j, rows in enumerate(micro):
        final = j == len(micro) - 1
        with contextlib.nullcontext() if final else split.no_sync(trainee):  # DDP: forward and backward inside
            part = _minibatch_loss(trainee, reference, m, (rows, True), batch, pad_id, cfg)
            loss = part.loss * (part.count / total)
            if part.kl is not None:
                loss = loss + cfg.kl_coef * part.kl * (part.num_own / own_total)
            loss = loss * split.world
            if not final:
                loss.backward()
        last = loss if final else None
        parts.append(part)
    _, metrics, cross = split.combine(_merged(parts, m, span, batch, cfg), m, minibatch, batch, cfg)
    if last is not None:
        last.backward()
    return metrics, cross


def _merged(parts: Sequence[MinibatchPart], m: int, rows: slice, batch: LearnerBatch,
            cfg: HacpoConfig) -> MinibatchPart:
    """The microbatches' parts as one part over their `rows`, its metrics as one pass computes them
    (its loss is only a metric: each microbatch's loss has had, or will have, its own backward)."""
    views, adv = batch.views[rows], batch.advantages[rows]
    count, num_own = sum(p.count for p in parts), sum(p.num_own for p in parts)
    kls = [(p.kl.detach(), p.num_own) for p in parts if p.kl is not None]
    kl = sum(k * n for k, n in kls) / sum(n for _, n in kls) if kls else None
    if cfg.mode == "grpo":  # token-weighted means of the microbatches' token-level metrics
        metrics = {key: sum(p.metrics[key] * p.count for p in parts) / count
                   for key in ("loss", "self_ratio_mean", "self_clip_frac")}
        metrics.update(num_self=float(len(views)), num_cross=0.0)
        return MinibatchPart(True, torch.tensor(metrics["loss"]), metrics, count, num_own, None, kl, [])
    # the loss function over every row's learner side
    is_self = torch.tensor([v.is_self for v in views], dtype=torch.bool)
    norm = torch.cat([p.learner_norm.detach().cpu() for p in parts])
    loss, metrics, flags = hacpo_policy_loss(norm, batch.old.norm[rows], adv, is_self, batch.omega[rows], m, cfg)
    return MinibatchPart(True, loss, metrics, count, num_own, norm, kl, cross_rows(views, adv, flags))


def _own_kl(reference: Reference, logp: Tensor, mask: Tensor, is_self: Tensor, views: Sequence[TrainingView],
            pad_id: int, temperature: float = 1.0) -> Tensor:
    """k3 KL of the learner's own samples in these rows against the reference policy (§5), both
    tempered at the rollouts' temperature."""
    own_rows = is_self.nonzero().squeeze(1)  # (k,)
    own = [views[i] for i in own_rows.tolist()]
    with torch.no_grad(), reference() as ref_model:
        ref_logp, _ = sequence_logprobs(ref_model, [v.prompt_ids for v in own], [v.response_ids for v in own], pad_id,
                                        temperature)
    width = ref_logp.shape[1]  # the longest own response; wider columns are masked for own rows
    return kl_k3(logp[own_rows][:, :width], ref_logp.to(logp.device), mask[own_rows][:, :width])
