"""One learner's HACPO update on a round's pool (design.md "Participant's round", step 1).

Runs in a lab's hacfed-client process (and in `hacfed sim`), called by `hacfed.clients.training`.

    views  -> own samples first, then each other source in agent order
    A      -> hacpo_advantages over the whole pool with this learner as k
    for each minibatch m (m counts every minibatch of the step):
        mean log π over the ratio tokens -> hacpo_policy_loss(..., update_index=m)
        + kl_coef · k3 KL on own samples against the reference policy
        backward, clip grad norm, optimizer step
"""

from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
from torch import Tensor

from hacfed.algorithm import HacpoConfig, capability_ratio, hacpo_advantages, hacpo_policy_loss, kl_k3
from hacfed.rollout.logprobs import sequence_logprobs
from hacfed.trajectory import TrainingView, Trajectory, build_training_view

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
    """Own samples first, then each other source in agent order (hacpo.md §5); gspo drops others."""
    rank = {agent: i for i, agent in enumerate(agent_order)}
    own = [t for t in pool if t.source_id == learner]
    if cfg.mode == "gspo":
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
) -> dict[str, float]:
    """Train `model` on `pool` with learner `learner`. Returns averaged metrics.

    `reference()` is a context manager yielding the reference model for the KL term (for LoRA:
    the same model with the adapter disabled); None or kl_coef == 0 skips the KL.
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
    # of other agents have no source summary and use the learner's own old log-prob too.
    source_mean = _old_means(model, views, pad_id, learner)
    use_kl = reference is not None and cfg.kl_coef > 0

    model.train()
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for m, start in enumerate(range(0, len(views), settings.minibatch_size)):
        idx = slice(start, start + settings.minibatch_size)
        batch = views[idx]
        logp, mask = sequence_logprobs(model, [v.prompt_ids for v in batch], [v.response_ids for v in batch], pad_id)
        learner_mean = mean_logp_over_ratio_tokens(logp, batch)  # (b,)
        is_self = torch.tensor([v.is_self for v in batch], dtype=torch.bool, device=device)
        loss, metrics = hacpo_policy_loss(
            learner_mean, source_mean[idx].to(device), advantages[idx].to(device), is_self,
            omega[idx].to(device), m, cfg,
        )
        if use_kl and bool(is_self.any()):
            own = is_self.nonzero().squeeze(1)
            with torch.no_grad(), reference() as ref_model:
                ref_logp, _ = sequence_logprobs(
                    ref_model, [batch[i].prompt_ids for i in own.tolist()], [batch[i].response_ids for i in own.tolist()], pad_id
                )
            width = ref_logp.shape[1]  # the longest own response; wider columns are masked for own rows
            kl = kl_k3(logp[own][:, :width], ref_logp.to(device), mask[own][:, :width])
            loss = loss + cfg.kl_coef * kl
            metrics["kl"] = float(kl.detach())
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
    model.eval()
    return out


def _old_means(model: Any, views: Sequence[TrainingView], pad_id: int, learner: str) -> Tensor:
    means = torch.tensor([v.source_mean_logp if v.source_mean_logp is not None else math.nan for v in views])
    missing = [i for i, v in enumerate(views) if v.source_mean_logp is None or v.source_id == learner]
    if missing:
        with torch.no_grad():
            sub = [views[i] for i in missing]
            logp, _ = sequence_logprobs(model, [v.prompt_ids for v in sub], [v.response_ids for v in sub], pad_id)
            means[missing] = mean_logp_over_ratio_tokens(logp, sub).float().cpu()
    return means


@contextlib.contextmanager
def frozen_copy_reference(ref_model: Any) -> Iterator[Any]:
    yield ref_model


@contextlib.contextmanager
def adapter_disabled_reference(peft_model: Any) -> Iterator[Any]:
    with peft_model.disable_adapter():
        yield peft_model
