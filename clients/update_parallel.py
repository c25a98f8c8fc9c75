"""A data-parallel HACPO update: the same `hacpo_update` loop, its rows split over the lab's ranks.

Every rank builds the same views and advantages over the whole pool (HACPO groups are per prompt
and span agents, so no rank may see only part of a group), scores its share of the old log-probs
(all-gathered), and computes each minibatch's loss on its contiguous row shard, rescaled to the
minibatch's global normalisation (sequences, tokens for grpo, own sequences for the KL) so that
DDP's averaged gradient is the one-process gradient; the metrics are recomputed from the gathered
rows, so one process and N processes report the same numbers.

`DataParallel` is what `hacfed.clients.update.hacpo_update` is handed instead of its one-process
default; `hacfed.clients.training.train_on_pool` builds it from the ranks' `Shards`.
"""

from __future__ import annotations

import contextlib
from typing import Any, Sequence

import torch
from torch import Tensor

from hacfed.algorithm import hacpo_policy_loss
from hacfed.clients.sequence_ratio import score_old_logps
from hacfed.clients.shards import Shards, global_scale
from hacfed.clients.update import LearnerBatch, MinibatchPart, token_slices
from hacfed.clients.update_metrics import CrossRow, cross_rows
from hacfed.hacpo_config import HacpoConfig
from hacfed.trajectory import TrainingView


class DataParallel:
    """This rank's part of every step of the update (a `RowSplit` of `hacfed.clients.update`)."""

    defers_first_minibatch = False  # every rank scores every old log-prob ahead, sharded
    skips_no_grad = False  # every row trains: the ranks' shards and collectives stay those of the full minibatch

    def __init__(self, shards: Shards, token_budget: int | None = None) -> None:
        self.shards = shards
        self.token_budget = token_budget  # padded tokens per forward of this rank's rows; None: one pass

    @property
    def world(self) -> int:
        return self.shards.world

    def wrap(self, model: Any) -> Any:
        return self.shards.wrap(model)  # DDP averages the gradients in backward

    def score_old(
        self, model: Any, views: Sequence[TrainingView], wanted: Sequence[int], pad_id: int, temperature: float = 1.0
    ) -> dict[int, Tensor]:
        lo, hi = self.shards.bounds(len(wanted))
        mine = score_old_logps(model, views, wanted[lo:hi], pad_id, self.token_budget, temperature) if hi > lo else {}
        out: dict[int, Tensor] = {}
        for part in self.shards.all_gather(sorted(mine.items())):
            out.update(part)
        return out

    def local_rows(self, start: int, size: int) -> tuple[slice, bool]:
        """This rank's rows of the minibatch [start, start + size). A rank without rows still runs
        one forward and backward (on one row, scaled by 0), because DDP reduces in backward."""
        lo, hi = self.shards.bounds(size)
        first = start + (lo if hi > lo else 0)
        return slice(first, first + max(hi - lo, 1)), hi > lo

    def microbatches(self, views: Sequence[TrainingView], start: int) -> list[slice] | None:
        """This rank's rows of the minibatch (`views`, the first at `start`) as microbatches within
        the token budget; None for one pass (a rank without rows runs its one stand-in row)."""
        mine, has_rows = self.local_rows(start, len(views))
        if not has_rows:
            return None
        return token_slices(views[mine.start - start:mine.stop - start], mine.start, self.token_budget)

    def no_sync(self, trainee: Any) -> contextlib.AbstractContextManager[Any]:
        return trainee.no_sync()  # gradients accumulate locally; the last backward all-reduces them

    def combine(self, part: MinibatchPart, m: int, minibatch: slice, batch: LearnerBatch,
                cfg: HacpoConfig) -> tuple[Tensor, dict[str, float], list[CrossRow]]:
        """This rank's loss scaled to the minibatch's global normalisation, and the minibatch's
        metrics and cross rows as one process computes them (from every rank's gathered rows)."""
        count, own, kl = (part.count, part.num_own, part.kl) if part.has_rows else (0.0, 0, None)
        norm = part.learner_norm
        if norm is not None:
            norm = norm.detach().cpu() if part.has_rows else norm.detach().cpu()[:0]
        kl_sum = float(kl.detach()) * own if kl is not None else 0.0
        parts = self.shards.all_gather((count, norm, kl_sum, own, part.metrics if part.has_rows else None,
                                        kl is not None))
        global_count = sum(p[0] for p in parts)
        own_global = sum(p[3] for p in parts)
        loss = part.loss * global_scale(count, global_count, self.shards.world)
        if kl is not None:
            loss = loss + cfg.kl_coef * kl * global_scale(own, own_global, self.shards.world)
        cross: list[CrossRow] = []
        if cfg.mode == "grpo":  # token-weighted means of each rank's token-level metrics
            out = {"num_self": sum(p[4]["num_self"] for p in parts if p[4]), "num_cross": 0.0}
            for key in ("loss", "self_ratio_mean", "self_clip_frac"):
                out[key] = sum(p[4][key] * p[0] for p in parts if p[4]) / global_count
        else:
            full = batch.views[minibatch]
            is_self = torch.tensor([v.is_self for v in full], dtype=torch.bool)
            adv = batch.advantages[minibatch]
            _, out, flags = hacpo_policy_loss(torch.cat([p[1] for p in parts]), batch.old.norm[minibatch], adv, is_self,
                                              batch.omega[minibatch], m, cfg)
            cross = cross_rows(full, adv, flags)
        if any(p[5] for p in parts):  # the minibatch has own samples and the KL is on
            out["kl"] = sum(p[2] for p in parts) / own_global
        return loss, out, cross
