"""Data-parallel training inside one lab: N processes on torch.distributed, one model replica each.

Why: a lab with several devices (or cores) trains its one policy faster when the round's work is
split; nothing about the federation changes. Rank 0 is the hacfed-client (or `hacfed sim`) process
itself and alone talks to the coordinator (Flower, outbox, checkpoints); ranks 1..N-1 are child
processes it starts (`python -m hacfed.clients.distributed`), each in its own process group, that
hold replicas of every participant's model, reference and optimizer and do what rank 0 tells them.

One round with N ranks (`RankGroup`):
  * training: rank 0 broadcasts the pool; every rank computes the same advantages over the whole
    pool (HACPO groups are per prompt and span agents, so no rank may see only part of a group),
    the learner's old log-probs are computed in shards and all-gathered, and each minibatch is split
    in contiguous row shards. Each rank's loss is rescaled so that DDP's averaged gradient equals the
    one-process gradient (`global_scale`), and the metrics are recomputed from the gathered per-row
    values, so one process and N processes report the same numbers (`hacfed.clients.update`).
  * rollout: each rank samples its contiguous share of the plan's prompts (`shard_bounds`), whole
    groups of G, and rank 0 gathers them back in plan order.
  * evaluation and checkpoints: rank 0 alone (the others wait for the next command).

Between commands the ranks block on a pipe from rank 0, not on a collective, so a lab can wait for
the coordinator for hours; a collective has a timeout (`timeout_s`), a rank that dies makes rank 0
raise `RankFailure` naming it, and a rank whose parent died exits on its own. gloo on CPU, NCCL
when the model is on CUDA (objects always travel over a gloo group).
"""

from __future__ import annotations

import atexit
import datetime
import functools
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from hacfed.clients.participant import Participant

    from hacfed.messages import RoundPlan, RoundUpdate
    from hacfed.trajectory import Trajectory

DEFAULT_TIMEOUT_S = 600.0  # one collective; idle waits between commands have none
MAX_NPROC = 64
HOST = "127.0.0.1"


class RankFailure(RuntimeError):
    """A rank of this lab died or a collective failed: the lab cannot continue its round."""


# --- pure helpers ------------------------------------------------------------------------------


def check_nproc(nproc: object) -> int:
    if isinstance(nproc, bool) or not isinstance(nproc, int) or not 1 <= nproc <= MAX_NPROC:
        raise ValueError(f"nproc must be an integer in 1..{MAX_NPROC}, got {nproc!r}")
    return nproc


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


# --- collectives -------------------------------------------------------------------------------


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


# --- rank 0's handle on the others -------------------------------------------------------------


@dataclass
class _Rank:
    rank: int
    proc: subprocess.Popen

    def describe(self) -> str:
        code = self.proc.poll()
        state = "running" if code is None else f"exited with code {code}"
        return f"rank {self.rank} (pid {self.proc.pid}) {state}"


class RankGroup:
    """Rank 0's side: starts the other ranks, sends them each command, gathers their results."""

    def __init__(self, ranks: list[_Rank], shards: Shards, timeout_s: float,
                 on_failure: Callable[[RankFailure], None] | None = None) -> None:
        self._ranks = ranks
        self.shards = shards
        self.timeout_s = timeout_s
        self._closed = False
        self._on_failure = on_failure
        atexit.register(self.close)
        if on_failure is not None:  # a rank that dies while the lab waits for its next round
            threading.Thread(target=self._watch, name="hacfed-rank-watch", daemon=True).start()

    def _watch(self) -> None:
        while not self._closed:
            if self._dead():
                time.sleep(0.5)  # close() may be stopping them right now
                if not self._closed:
                    self._report(self._failure("waiting for the next round"))
                return
            time.sleep(1.0)

    @property
    def world(self) -> int:
        return self.shards.world

    def _dead(self) -> list[_Rank]:
        return [r for r in self._ranks if r.proc.poll() is not None]

    def _failure(self, doing: str, exc: BaseException | None = None) -> RankFailure:
        dead = self._dead()
        if not dead:  # a collective may fail a moment before the process is reaped
            time.sleep(0.5)
            dead = self._dead()
        who = "; ".join(r.describe() for r in dead) or f"no rank exited ({exc})"
        failure = RankFailure(f"data-parallel training failed while {doing}: {who}; stopping the lab "
                              "(run the same command to resume from the last checkpoint)")
        if doing != "waiting for the next round":
            self._report(failure)
        return failure

    def _report(self, failure: RankFailure) -> None:
        on_failure, self._on_failure = self._on_failure, None  # once, from whichever thread saw it first
        if on_failure is not None:
            on_failure(failure)

    def _command(self, doing: str, payload: Any) -> None:
        if self._closed:
            raise RankFailure(f"data-parallel ranks are closed; cannot run {doing}")
        if self._dead():
            raise self._failure(doing)
        try:
            for r in self._ranks:
                r.proc.stdin.write(b"\n")
                r.proc.stdin.flush()
            self.shards.broadcast(payload)
        except (OSError, RuntimeError) as exc:
            raise self._failure(doing, exc) from exc

    def _collective(self, doing: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except RuntimeError as exc:  # gloo/NCCL errors (DistBackendError is one) when a peer is gone
            if isinstance(exc, RankFailure):
                raise
            if self._dead() or "connection" in str(exc).lower() or "timed out" in str(exc).lower():
                raise self._failure(doing, exc) from exc
            raise

    def train(self, participant: Participant, update: RoundUpdate) -> dict[str, float]:
        from hacfed.clients.training import train_on_pool

        pid = participant.participant_id
        self._command("training", ("train", pid, update, participant._own, participant.capabilities))
        return self._collective(
            "training", train_on_pool, participant.model, participant.tokenizer, participant.optimizer,
            participant._reference, update, learner=pid, own=participant._own,
            capabilities=participant.capabilities, cfg=participant.cfg, shards=self.shards,
        )

    def rollout(self, participant: Participant, plan: RoundPlan) -> tuple[Trajectory, ...]:
        pid = participant.participant_id
        self._command("rollout", ("rollout", pid, plan, participant.policy_version))
        mine = _rollout_share(participant.model, participant.tokenizer, participant.task, participant.cfg, plan,
                              participant.policy_version, self.shards)
        parts = self._collective("rollout", self.shards.all_gather, mine)
        return tuple(t for part in parts for t in part)

    def close(self) -> None:
        """Stop every rank: EOF on its pipe (it exits at once when idle), then SIGTERM, SIGKILL."""
        if self._closed:
            return
        self._closed = True
        for r in self._ranks:
            try:
                r.proc.stdin.close()
            except OSError:
                pass
        deadline = time.monotonic() + 10.0
        for r in self._ranks:
            try:
                r.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(r.proc.pid, signal.SIGTERM)
                try:
                    r.proc.wait(timeout=5.0)
                except subprocess.TimeoutExpired:
                    _signal_group(r.proc.pid, signal.SIGKILL)
                    r.proc.wait()
        if dist.is_initialized():
            dist.destroy_process_group()


#: The failure that stopped this hacfed-client (set by `stop_this_process`): its exit code is 1, not
#: the 0 of a Ctrl-C, so a scheduler (Slurm, Kubernetes) sees the lab failed.
stopped_by: RankFailure | None = None


def stop_this_process(failure: RankFailure) -> None:
    """hacfed-client's reaction to a failed rank: say why, then stop the way Ctrl-C or SIGTERM does
    (its supervisor ends the SuperNode, and the ranks are closed at exit), instead of answering
    every later round with an error."""
    global stopped_by
    stopped_by = failure
    print(f"hacfed-client: error: {failure}", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGTERM)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)  # each rank leads its own process group (start_new_session)
    except (ProcessLookupError, PermissionError):
        pass


def _reference_model(participant: Participant) -> Any:
    """The frozen reference copy of a full fine-tune (a LoRA reference is the policy itself)."""
    if participant.cfg.finetune == "lora":
        return None
    return participant._reference.args[0]


def _uses_cuda(participants: Sequence[Participant]) -> bool:
    return any(str(p.cfg.device).startswith("cuda") for p in participants) and torch.cuda.is_available()


def start_ranks(nproc: int, participants: Sequence[Participant], *, timeout_s: float = DEFAULT_TIMEOUT_S,
                python: str = sys.executable, on_failure: Callable[[RankFailure], None] | None = None) -> RankGroup:
    """Start ranks 1..nproc-1 with replicas of `participants` (their current weights, reference and
    optimizer state, so a resumed lab continues exactly), and join them in one process group.

    on_failure(failure) runs when a rank is found dead (also between rounds, watched every second),
    before the failing call raises; None: only the call raises."""
    check_nproc(nproc)
    if nproc < 2:
        raise ValueError("start_ranks needs nproc >= 2 (one process trains without torch.distributed)")
    if dist.is_initialized():
        raise RuntimeError("torch.distributed is already initialised in this process")
    for p in participants:
        if p.cfg.rollout_backend != "hf":
            raise ValueError(f"nproc {nproc} needs rollout_backend 'hf', got {p.cfg.rollout_backend!r} for "
                             f"{p.participant_id} (a vLLM engine is one process)")
    cuda = _uses_cuda(participants)
    if cuda and torch.cuda.device_count() < nproc:
        raise ValueError(f"nproc {nproc} needs {nproc} CUDA devices, found {torch.cuda.device_count()}")
    handoff_dir = Path(tempfile.mkdtemp(prefix="hacfed-ranks-"))
    handoff = handoff_dir / "replicas.pt"
    torch.save({"cuda": cuda, "agents": [
        {"cfg": p.cfg, "model": p.model, "reference": _reference_model(p), "tokenizer": p.tokenizer,
         "task": p.task, "optimizer": p.optimizer.state_dict(), "defaults": dict(p.optimizer.defaults)}
        for p in participants]}, handoff, pickle_protocol=pickle.HIGHEST_PROTOCOL)
    store = dist.TCPStore(HOST, 0, nproc, is_master=True, timeout=datetime.timedelta(seconds=timeout_s),
                          wait_for_workers=False)
    env = {**os.environ, "MASTER_ADDR": HOST, "MASTER_PORT": str(store.port), "WORLD_SIZE": str(nproc),
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    ranks: list[_Rank] = []
    try:
        for r in range(1, nproc):
            cmd = [python, "-m", "hacfed.clients.distributed", "--rank", str(r), "--world", str(nproc),
                   "--port", str(store.port), "--handoff", str(handoff), "--timeout", str(timeout_s)]
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, env={**env, "RANK": str(r)}, start_new_session=True)
            ranks.append(_Rank(r, proc))
        _wait_ready(store, ranks, timeout_s)
        backend = "nccl" if cuda else "gloo"
        if cuda:
            torch.cuda.set_device(0)
        dist.init_process_group(backend, store=store, rank=0, world_size=nproc,
                                timeout=datetime.timedelta(seconds=timeout_s))
        objects = dist.new_group(backend="gloo") if cuda else None
        shards = Shards(0, nproc, objects, [0] if cuda else None)
        shards.broadcast("ready")  # every rank has joined both groups
    except BaseException:
        for r in ranks:
            _signal_group(r.proc.pid, signal.SIGKILL)
            r.proc.wait()
        if dist.is_initialized():
            dist.destroy_process_group()
        raise
    finally:
        handoff.unlink(missing_ok=True)
        handoff_dir.rmdir()
    return RankGroup(ranks, shards, timeout_s, on_failure)


def _wait_ready(store: Any, ranks: list[_Rank], timeout_s: float) -> None:
    """Until every rank has loaded its replicas; a rank that exits first fails fast, by name."""
    deadline = time.monotonic() + timeout_s
    keys = [f"hacfed/ready/{r.rank}" for r in ranks]
    while not store.check(keys):
        dead = [r for r in ranks if r.proc.poll() is not None]
        if dead:
            raise RankFailure("data-parallel rank failed to start: " + "; ".join(r.describe() for r in dead))
        if time.monotonic() > deadline:
            raise RankFailure(f"data-parallel ranks not ready after {timeout_s:.0f} s")
        time.sleep(0.05)


def _rollout_share(model: Any, tokenizer: Any, task: Any, cfg: Any, plan: RoundPlan, policy_version: int,
                   shards: Shards) -> list[Trajectory]:
    from hacfed.clients.rollout_and_eval import rollout_plan

    part = sub_plan(plan, shards.world, shards.rank)
    if not part.prompts:
        return []
    return list(rollout_plan(
        model, tokenizer, task, part, participant_id=cfg.participant_id, policy_version=policy_version,
        base_seed=rollout_seed(cfg.seed, shards.rank), batch_size=cfg.rollout_batch_size,
    ))


# --- ranks 1..N-1 ------------------------------------------------------------------------------


@dataclass
class _Replica:
    cfg: Any
    model: Any
    tokenizer: Any
    task: Any
    optimizer: torch.optim.Optimizer
    reference: Any


def _replica(entry: dict, device: str) -> _Replica:
    from hacfed.clients.update import adapter_disabled_reference, frozen_copy_reference

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
    import argparse

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
    from hacfed.clients.training import train_on_pool

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
                _, _, update, own, capabilities = command
                train_on_pool(rep.model, rep.tokenizer, rep.optimizer, rep.reference, update, learner=pid, own=own,
                              capabilities=capabilities, cfg=rep.cfg, shards=shards)
            elif kind == "rollout":
                _, _, plan, policy_version = command
                shards.all_gather(_rollout_share(rep.model, rep.tokenizer, rep.task, rep.cfg, plan, policy_version,
                                                 shards))
            else:
                raise ValueError(f"unknown command {kind!r}")
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(worker_main())
