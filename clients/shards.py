"""What data-parallel ranks of one lab share: how work is split, and the collectives that join it.

Pure helpers (`shard_bounds`, `global_scale`, `rollout_seed`, `sub_plan`) and
`Shards`, the collective operations over an initialised torch.distributed group. The ranks'
processes are started by `hacfed.clients.distributed` (rank 0) and run `hacfed.clients.rank_worker`
(ranks 1..N-1); a data-parallel update is `hacfed.clients.update_parallel`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch.distributed as dist

from hacfed.messages import RoundPlan

DEFAULT_TIMEOUT_S = 600.0  # one collective; idle waits between commands have none
HOST = "127.0.0.1"


def shard_bounds(n: int, world: int, rank: int) -> tuple[int, int]:
    """[lo, hi) of rank's contiguous share of n items; the first n % world ranks get one more.

    Contiguous (not strided) so that gathering the shards in rank order restores the original order."""
    if world < 1 or not 0 <= rank < world or n < 0:
        raise ValueError(f"shard_bounds needs n >= 0 and 0 <= rank < world, got n={n} world={world} rank={rank}")
    base, extra = divmod(n, world)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


def global_scale(local_count: float, global_count: float, world: int) -> float:
    """Factor for a shard's loss that is normalised by its own `local_count`: with it, DDP's mean of
    the ranks' gradients equals the gradient of the one-process loss normalised by `global_count`.

    shard loss = sum_shard l_i / local; wanted = sum_shard l_i * world / global."""
    if global_count <= 0 or local_count <= 0:
        return 0.0
    return local_count * world / global_count


def rollout_seed(base_seed: int, rank: int) -> int:
    """Rank 0 samples with the lab's own seed; other ranks with disjoint derived ones."""
    return base_seed if rank == 0 else base_seed + (rank << 32)


def sub_plan(plan: RoundPlan, world: int, rank: int) -> RoundPlan:
    """The part of `plan` one rank rolls out: whole prompts (groups of G stay on one rank)."""
    lo, hi = shard_bounds(len(plan.prompts), world, rank)
    return replace(plan, prompts=plan.prompts[lo:hi])


class Shards:
    """The collective operations one data-parallel update needs, over an initialised group.

    Everything goes through gather-to-all of Python objects, combined in rank order, so every
    rank ends with bitwise the same values (and the same metrics)."""

    def __init__(self, rank: int, world: int, object_group: Any = None, device_ids: list[int] | None = None) -> None:
        self.rank = rank
        self.world = world
        self._objects = object_group  # a gloo group when the default one is NCCL
        self._device_ids = device_ids
        self._wrapped: dict[int, Any] = {}

    def bounds(self, n: int) -> tuple[int, int]:
        return shard_bounds(n, self.world, self.rank)

    def all_gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj, group=self._objects)
        return out

    def broadcast(self, obj: Any = None) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self._objects)
        return box[0]

    def wrap(self, model: Any) -> Any:
        """The DDP wrapper of `model` (made once: its construction is itself a collective that
        copies rank 0's parameters to every rank). Buffers are not re-broadcast on each forward:
        they are constant here, and a forward must never be a collective (scoring is sharded)."""
        key = id(model)
        if key not in self._wrapped:
            from torch.nn.parallel import DistributedDataParallel

            self._wrapped[key] = DistributedDataParallel(model, device_ids=self._device_ids, forward_sync_buffers=False)
        return self._wrapped[key]
