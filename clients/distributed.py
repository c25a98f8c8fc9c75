"""Data-parallel training inside one lab: N processes on torch.distributed, one model replica each.

Why: a lab with several devices (or cores) trains its one policy faster when the round's work is
split; nothing about the federation changes. Rank 0 is the hacfed-client (or `hacfed sim`) process
itself and alone talks to the coordinator (Flower, outbox, checkpoints); ranks 1..N-1 are child
processes it starts (`python -m hacfed.clients.distributed`, which runs `hacfed.clients.rank_worker`),
each in its own process group, that hold replicas of every participant's model, reference and
optimizer and do what rank 0 tells them.

One round with N ranks (`RankGroup`):
  * training: rank 0 broadcasts the pool; every rank computes the same advantages over the whole
    pool (HACPO groups are per prompt and span agents, so no rank may see only part of a group),
    the learner's old log-probs are computed in shards and all-gathered, and each minibatch is split
    in contiguous row shards. Each rank's loss is rescaled so that DDP's averaged gradient equals the
    one-process gradient (`shards.global_scale`), and the metrics are recomputed from the gathered
    per-row values, so one process and N processes report the same numbers
    (`hacfed.clients.update_parallel`).
  * rollout: each rank samples its contiguous share of the plan's prompts (`shards.shard_bounds`), whole
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
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist

from hacfed.clients.rank_worker import rollout_share, worker_main
from hacfed.clients.shards import DEFAULT_TIMEOUT_S, HOST, Shards
from hacfed.clients.training import train_on_pool
from hacfed.messages import RoundPlan, RoundUpdate
from hacfed.trajectory import Trajectory

__all__ = ["RankFailure", "RankGroup", "start_ranks", "stop_this_process", "DEFAULT_TIMEOUT_S"]


class RankFailure(RuntimeError):
    """A rank of this lab died or a collective failed: the lab cannot continue its round."""


class Replicated(Protocol):
    """What rank 0 replicates on every rank and trains or rolls out with them
    (`hacfed.clients.participant.Participant`)."""

    participant_id: str
    model: Any
    tokenizer: Any
    optimizer: torch.optim.Optimizer
    task: Any
    cfg: Any
    capabilities: dict[str, float]
    policy_version: int
    own_samples: dict[str, Trajectory]
    reference: Any

    def learner_local(self) -> dict[str, Any]: ...


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

    def train(self, participant: Replicated, update: RoundUpdate) -> dict[str, float]:
        pid = participant.participant_id
        local = participant.learner_local()  # the pool's temperature and the lab's partner trust
        self._command("training", ("train", pid, update, participant.own_samples, participant.capabilities, local))
        return self._collective(
            "training", train_on_pool, participant.model, participant.tokenizer, participant.optimizer,
            participant.reference, update, learner=pid, own=participant.own_samples,
            capabilities=participant.capabilities, cfg=participant.cfg, shards=self.shards, **local,
        )

    def rollout(self, participant: Replicated, plan: RoundPlan) -> tuple[Trajectory, ...]:
        pid = participant.participant_id
        self._command("rollout", ("rollout", pid, plan, participant.policy_version))
        mine = rollout_share(participant.model, participant.tokenizer, participant.task, participant.cfg, plan,
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


def _reference_model(participant: Replicated) -> Any:
    """The frozen reference copy of a full fine-tune (a LoRA reference is the policy itself)."""
    if participant.cfg.finetune == "lora":
        return None
    return participant.reference.args[0]


def _uses_cuda(participants: Sequence[Replicated]) -> bool:
    return any(str(p.cfg.device).startswith("cuda") for p in participants) and torch.cuda.is_available()


def start_ranks(nproc: int, participants: Sequence[Replicated], *, timeout_s: float = DEFAULT_TIMEOUT_S,
                python: str = sys.executable, on_failure: Callable[[RankFailure], None] | None = None) -> RankGroup:
    """Start ranks 1..nproc-1 with replicas of `participants` (their current weights, reference and
    optimizer state, so a resumed lab continues exactly), and join them in one process group.

    on_failure(failure) runs when a rank is found dead (also between rounds, watched every second),
    before the failing call raises; None: only the call raises. `nproc` was checked where it entered
    (`ParticipantConfig.nproc`, or `hacfed sim --nproc`)."""
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


if __name__ == "__main__":  # ranks 1..N-1 (hacfed.clients.rank_worker)
    sys.exit(worker_main())
