"""Ranks 1..N-1 of a lab's data-parallel training: replicas that do what rank 0 tells them.

Started by `hacfed.clients.distributed.start_ranks` as `python -m hacfed.clients.distributed
--rank R --world N --port P --handoff FILE` (each in its own process group). A rank loads the
replicas rank 0 handed off (model, reference, tokenizer, task and optimizer state of every
participant), joins the process group, then waits on its stdin pipe for each command: "train"
(its part of `train_on_pool`) or "rollout" (its share of the plan's prompts, `rollout_share`).
EOF on the pipe, or its parent gone, ends it.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from hacfed.clients.rollout_and_eval import rollout_plan
from hacfed.clients.shards import DEFAULT_TIMEOUT_S, HOST, Shards, rollout_seed, sub_plan
from hacfed.clients.training import adapter_disabled_reference, frozen_copy_reference, train_on_pool
from hacfed.messages import RoundPlan
from hacfed.trajectory import Trajectory


def rollout_share(model: Any, tokenizer: Any, task: Any, cfg: Any, plan: RoundPlan, policy_version: int,
                  shards: Shards) -> list[Trajectory]:
    """This rank's samples of `plan`: its contiguous share of the prompts, whole groups of G."""
    part = sub_plan(plan, shards.world, shards.rank)
    if not part.prompts:
        return []
    return list(rollout_plan(
        model, tokenizer, task, part, participant_id=cfg.participant_id, policy_version=policy_version,
        base_seed=rollout_seed(cfg.seed, shards.rank), batch_size=cfg.rollout_batch_size,
    ))


@dataclass
class _Replica:
    cfg: Any
    model: Any
    tokenizer: Any
    task: Any
    optimizer: torch.optim.Optimizer
    reference: Any


def _replica(entry: dict, device: str) -> _Replica:
    model = entry["model"].to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=entry["defaults"]["lr"])
    optimizer.load_state_dict(entry["optimizer"])  # every hyperparameter of each group, and the moments
    if entry["reference"] is None:
        reference = functools.partial(adapter_disabled_reference, model)
    else:
        reference = functools.partial(frozen_copy_reference, entry["reference"].to(device))
    return _Replica(entry["cfg"], model, entry["tokenizer"], entry["task"], optimizer, reference)


def _watch_parent(parent: int) -> None:
    """Exit when rank 0 is gone (its pipe also closes, but a collective in progress would wait)."""
    while True:
        if os.getppid() != parent:
            os._exit(3)
        time.sleep(1.0)


def worker_main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hacfed.clients.distributed", allow_abbrev=False,
                                     description="one data-parallel rank of a lab (started by hacfed-client --nproc)")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--handoff", required=True)
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S)
    args = parser.parse_args(argv)
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    tag = f"hacfed rank {args.rank}/{args.world}"
    try:
        return _serve(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - rank 0 reports this rank's exit; the reason goes to stderr here
        print(f"{tag}: error: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1


def _serve(args: Any) -> int:
    timeout = datetime.timedelta(seconds=args.timeout)
    store = dist.TCPStore(HOST, args.port, args.world, is_master=False, timeout=timeout)
    state = torch.load(args.handoff, weights_only=False)
    cuda = bool(state["cuda"])
    device = f"cuda:{args.rank}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(args.rank)
    replicas = {entry["cfg"].participant_id: _replica(entry, device) for entry in state["agents"]}
    del state
    store.set(f"hacfed/ready/{args.rank}", "1")
    dist.init_process_group("nccl" if cuda else "gloo", store=store, rank=args.rank, world_size=args.world,
                            timeout=timeout)
    objects = dist.new_group(backend="gloo") if cuda else None
    shards = Shards(args.rank, args.world, objects, [args.rank] if cuda else None)
    shards.broadcast()  # "ready"
    stdin = sys.stdin.buffer
    try:
        while stdin.readline():  # EOF: rank 0 closed the group (or is gone)
            command = shards.broadcast()
            kind, pid = command[0], command[1]
            rep = replicas[pid]
            if kind == "train":
                _, _, update, own, capabilities, local = command
                train_on_pool(rep.model, rep.tokenizer, rep.optimizer, rep.reference, update, learner=pid, own=own,
                              capabilities=capabilities, cfg=rep.cfg, shards=shards, **local)
            elif kind == "rollout":
                _, _, plan, policy_version = command
                shards.all_gather(rollout_share(rep.model, rep.tokenizer, rep.task, rep.cfg, plan, policy_version,
                                                shards))
            else:
                raise ValueError(f"unknown command {kind!r}")
    finally:
        dist.destroy_process_group()
    return 0
