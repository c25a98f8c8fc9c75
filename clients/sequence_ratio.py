"""The two sides of each sample's sequence ratio in the HACPO update (docs/hacpo.md §5).

    s = exp(clamp(learner side − old side, ±max_abs_log_ratio))

learner side: the current learner's mean log-prob over the response's ratio tokens, its own EOS
  left out (`TrainingView.ratio_token_count`); for xhacpo's per-byte unit, their sum per UTF-8 byte.
old side: for another agent's sample, its source's summary source_logp_sum / source_token_count
  (per byte for xhacpo); for an own sample the learner's own pre-update log-probs of the same tokens,
  recomputed with the training forward rather than taken from the rollout engine (whose kernels may
  differ), so own ratios start at exactly 1. A peer's EOS-only sample has no summary and mode "sapo"
  treats peers' text as the learner's own: both use the learner's pre-update log-probs too.

Used by `hacfed.clients.update` (one learner's update) and `hacfed.clients.update_parallel`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Collection, Sequence

import torch
from torch import Tensor

from hacfed.clients.microbatch import split_rows
from hacfed.hacpo_config import HacpoConfig
from hacfed.rollout.logprobs import sequence_logprobs
from hacfed.trajectory import TrainingView

SCORE_CHUNK = 256  # rows per no-grad scoring forward


def needs_own_old(view: TrainingView, learner: str, cfg: HacpoConfig) -> bool:
    """Whether the old side of `view` is the learner's own pre-update log-prob (module docstring)."""
    return view.source_id == learner or view.source_mean_logp is None or cfg.mode == "sapo"


def per_byte(view: TrainingView, learner: str, cfg: HacpoConfig) -> bool:
    """xhacpo's tokenizer-invariant ratio applies to cross samples with a source summary."""
    return (
        cfg.cross_ratio_unit == "byte" and view.source_id != learner
        and view.source_mean_logp is not None and view.text_bytes > 0
    )


def ratio_mask(logp: Tensor, views: Sequence[TrainingView]) -> Tensor:
    """(B, T) 1 on each view's first `ratio_token_count` tokens, 0 elsewhere."""
    counts = torch.tensor([v.ratio_token_count for v in views], device=logp.device)
    positions = torch.arange(logp.shape[1], device=logp.device).unsqueeze(0)  # (1, T)
    return (positions < counts.unsqueeze(1)).to(logp.dtype)  # (B, T)


def learner_norms(logp: Tensor, views: Sequence[TrainingView], by_bytes: Tensor) -> Tensor:
    """(B, T) per-token log-probs -> (B,) the learner's side: token mean, or sum per byte of text."""
    summed = (logp * ratio_mask(logp, views)).sum(dim=1)  # (B,)
    counts = torch.tensor([v.ratio_token_count for v in views], device=logp.device, dtype=logp.dtype)
    text_bytes = torch.tensor([max(v.text_bytes, 1) for v in views], device=logp.device, dtype=logp.dtype)
    return torch.where(by_bytes, summed / text_bytes, summed / counts)


def mean_logp_over_ratio_tokens(logp: Tensor, views: Sequence[TrainingView]) -> Tensor:
    """(B, T) per-token log-probs -> (B,) mean over each view's ratio tokens (the token unit)."""
    return learner_norms(logp, views, torch.zeros(len(views), dtype=torch.bool, device=logp.device))


def score_old_logps(model: Any, views: Sequence[TrainingView], indices: Sequence[int],
                    pad_id: int, token_budget: int | None = None, temperature: float = 1.0) -> dict[int, Tensor]:
    """{i: the model's log-probs of views[i]'s ratio tokens} for each i in `indices`, no gradient,
    of the policy tempered at `temperature`; in forwards of at most SCORE_CHUNK rows and, with
    `token_budget`, of that many padded tokens."""
    out: dict[int, Tensor] = {}
    with torch.no_grad():
        for chunk in _score_chunks(views, indices, token_budget):
            sub = [views[i] for i in chunk]
            logp, _ = sequence_logprobs(model, [v.prompt_ids for v in sub], [v.response_ids for v in sub], pad_id,
                                        temperature)
            for row, i in enumerate(chunk):
                out[i] = logp[row, : views[i].ratio_token_count].float().cpu()
    return out


def _score_chunks(views: Sequence[TrainingView], indices: Sequence[int], token_budget: int | None) -> list[list[int]]:
    chunks = [list(indices[s:s + SCORE_CHUNK]) for s in range(0, len(indices), SCORE_CHUNK)]
    if token_budget is None:
        return chunks
    out = []
    for chunk in chunks:
        groups = split_rows([len(views[i].prompt_ids) for i in chunk], [len(views[i].response_ids) for i in chunk],
                            token_budget)
        out += [[chunk[k] for k in g] for g in groups]
    return out


@dataclass
class OldSide:
    """The old side of every sample's ratio, in training order.

    norm: (N,) in the unit of each sample's ratio. tokens: the learner's pre-update log-probs of
    each view's ratio tokens where `needs_own_old` (grpo's token ratios read them), else None.
    pending: rows of minibatch 0 whose old side its own training forward supplies (`fill_pending`);
    their `norm` is NaN until then."""

    norm: Tensor
    tokens: list[Tensor | None]
    pending: list[int]

    def fill_pending(self, views: Sequence[TrainingView], logp: Tensor, learner_norm: Tensor | None,
                     start: int = 0) -> None:
        """Minibatch 0 trains on the pre-update policy: its forward (rows start..start+b-1, all of
        it or one microbatch), detached, is the old log-prob of the pending rows among them;
        `learner_norm` (None for grpo) gives their `norm`."""
        rows = [i for i in self.pending if start <= i < start + logp.shape[0]]
        for i in rows:
            self.tokens[i] = logp[i - start, : views[i].ratio_token_count].detach().float().cpu()
        if learner_norm is not None and rows:
            self.norm[rows] = learner_norm.detach().cpu()[[i - start for i in rows]]

    def rows(self, keep: Sequence[int]) -> OldSide:
        """The old side of rows `keep` alone, renumbered 0..len(keep)-1 (pending rows stay pending)."""
        waiting = set(self.pending)
        return OldSide(self.norm[list(keep)].clone(), [self.tokens[i] for i in keep],
                       [j for j, i in enumerate(keep) if i in waiting])


def old_side(views: Sequence[TrainingView], scored: dict[int, Tensor], by_bytes: Tensor,
             pending: Sequence[int], untrained: Collection[int] = ()) -> OldSide:
    """The `OldSide` of `views` from the rows scored ahead (`scored`) and the source summaries.
    `untrained`: rows no forward runs on (`hacfed.clients.no_grad_rows`), whose old side is never
    read; NaN, since one that needs the learner's own log-prob was not scored."""
    norm = torch.empty(len(views))
    waiting = set(pending) | set(untrained)
    for i, v in enumerate(views):
        if i in waiting:
            norm[i] = math.nan
        elif i in scored:
            norm[i] = scored[i].mean()
        elif bool(by_bytes[i]):
            norm[i] = v.source_logp_sum / v.text_bytes
        else:
            norm[i] = v.source_mean_logp
    tokens = [scored.get(i) for i in range(len(views))]
    return OldSide(norm, tokens, list(pending))


def pad_rows(rows: Sequence[Tensor | None], width: int, device: torch.device) -> Tensor:
    """(B, width) of per-token old log-probs, zero-padded (grpo's token ratios)."""
    out = torch.zeros((len(rows), width))
    for i, row in enumerate(rows):
        if row is None:
            raise ValueError("grpo needs the learner's old log-probs of every sample")
        out[i, : row.shape[0]] = row
    return out.to(device)
