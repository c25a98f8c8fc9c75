"""Atomic participant checkpoints: temp dir, fsync every file, rename, fsync the parent.

Runs in a lab's hacfed-client process (and in `hacfed sim`): `Participant.step` saves one after
every round and a restarted participant resumes from the newest; the participant service writes
its small state files with `atomic_write_text`. Torch is imported only by the functions that save
or restore a policy, so the service imports this module torch-free.

Layout: <dir>/ckpt-<round:06d>/{model.pt, optimizer.pt, rng.pt, state.json} and <dir>/LATEST naming
the newest complete checkpoint (a second checkpoint of the same round gets `-2`, `-3`, ...; one
written by `hacfed-client replay` is `ckpt-<round>-replay`). A crash at any point leaves either the previous or the new
checkpoint, never a partial one. Only our own files are ever loaded with torch.load (never peer
data).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hacfed.crashpoints import crash_point
from hacfed.trajectory import ChatMessage, Trajectory

if TYPE_CHECKING:
    import torch


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: Path) -> None:
    for root, _dirs, files in os.walk(path):
        for name in files:
            with open(Path(root) / name, "rb+") as fh:
                os.fsync(fh.fileno())
        fsync_dir(Path(root))


def atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def save_checkpoint(directory: Path, round_id: int, write: Any, keep: int = 2, suffix: str = "") -> Path:
    """`write(tmp_dir)` fills a fresh directory; it becomes ckpt-<round><suffix> atomically, then
    LATEST. The `keep` newest checkpoints stay (how far back a purge can roll a lab back)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    base = f"ckpt-{round_id:06d}{suffix}"
    final, n = directory / base, 1
    while final.exists():  # never replace a checkpoint LATEST may name: take the next free name
        n += 1
        final = directory / f"{base}-{n}"
    tmp = Path(tempfile.mkdtemp(dir=directory, prefix=".tmp-ckpt-"))
    try:
        write(tmp)
        fsync_tree(tmp)
        crash_point("mid_checkpoint")  # the fault suite's kill point: files written, not yet renamed
        os.rename(tmp, final)
        fsync_dir(directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    atomic_write_text(directory / "LATEST", final.name + "\n")
    _prune(directory, keep, final.name)
    return final


def latest_checkpoint(directory: Path) -> Path | None:
    pointer = Path(directory) / "LATEST"
    if not pointer.exists():
        return None
    path = Path(directory) / pointer.read_text().strip()
    if not (path / "state.json").exists():
        raise ValueError(f"checkpoint pointer {pointer} names {path.name}, which is incomplete or missing")
    return path


def read_state(path: Path) -> dict:
    return json.loads((Path(path) / "state.json").read_text())


def checkpoints(directory: Path) -> list[Path]:
    """The complete checkpoints kept in `directory`, oldest first."""
    return sorted(p for p in Path(directory).glob("ckpt-*") if p.is_dir() and (p / "state.json").exists())


def pool_round_of(state: Mapping[str, Any]) -> int | None:
    """The last pool a checkpoint's policy trained on (older checkpoints did not record it: the
    update that asked for plan k carried pool k - 1)."""
    if "pool_round" in state:
        return state["pool_round"]
    return None if state["round"] <= 0 else int(state["round"]) - 1


def _prune(directory: Path, keep: int, newest: str) -> None:
    ckpts = sorted(p for p in directory.glob("ckpt-*") if p.is_dir())
    for stale in ckpts[:-keep]:
        if stale.name != newest:
            shutil.rmtree(stale, ignore_errors=True)
    for tmp in directory.glob(".tmp-ckpt-*"):
        shutil.rmtree(tmp, ignore_errors=True)


@dataclass(frozen=True)
class RestoredState:
    """What a participant checkpoint restores besides the weights, the optimizer and the RNG."""

    policy_version: int
    last_round: int | None
    capabilities: dict[str, float]
    own: dict[str, Trajectory]  # own trajectories of the last rollout, with local token ids
    last_pool_round: int | None = None  # the pool of the last update answered (None: none yet)
    learner_state: dict[str, Any] = field(default_factory=dict)  # the lab's own learning state (JSON)


def save_participant(
    directory: Path, *, participant_id: str, last_round: int | None, policy_version: int,
    last_pool_round: int | None = None,
    capabilities: Mapping[str, float], config: Mapping[str, Any], model: Any, optimizer: Any,
    own: Mapping[str, Trajectory], keep: int = 2, suffix: str = "", learner_state: Mapping[str, Any] | None = None,
) -> Path:
    """Checkpoint a participant after the round it rolled out last (`ckpt-000000` before any).
    `learner_state`: JSON-able state the lab learned by itself (its partner trust, ...)."""
    import torch  # the participant has loaded it already; the service imports this module torch-free

    round_id = last_round if last_round is not None else -1

    def write(tmp: Path) -> None:
        torch.save(_trainable_state(model), tmp / "model.pt")
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save({"torch": torch.get_rng_state()}, tmp / "rng.pt")
        state = {
            "participant_id": participant_id,
            "round": round_id,
            "pool_round": last_pool_round,
            "policy_version": policy_version,
            "capabilities": capabilities,
            "config": config,
            "own_trajectories": [_trajectory_record(t) for t in own.values()],
        }
        if learner_state:
            state["learner_state"] = dict(learner_state)
        (tmp / "state.json").write_text(json.dumps(state))

    return save_checkpoint(directory, max(round_id, 0), write, keep=keep, suffix=suffix)


def restore_participant(
    directory: Path, participant_id: str, model: Any, optimizer: Any, path: Path | None = None
) -> RestoredState | None:
    """Load the newest checkpoint (or `path`) into `model`, `optimizer` and torch's RNG; None when
    there is none."""
    import torch  # see save_participant

    path = latest_checkpoint(directory) if path is None else Path(path)
    if path is None:
        return None
    state = read_state(path)
    if state["participant_id"] != participant_id:
        raise ValueError(
            f"checkpoint {path} belongs to {state['participant_id']!r}, not {participant_id!r}"
        )
    model.load_state_dict(torch.load(path / "model.pt", weights_only=True), strict=False)
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
    torch.set_rng_state(torch.load(path / "rng.pt", weights_only=True)["torch"])
    return RestoredState(
        policy_version=int(state["policy_version"]),
        last_round=None if state["round"] < 0 else int(state["round"]),
        capabilities={k: float(v) for k, v in state["capabilities"].items()},
        own=own_trajectories(state),
        last_pool_round=pool_round_of(state),
        learner_state=dict(state.get("learner_state", {})),
    )


def own_trajectories(state: Mapping[str, Any]) -> dict[str, Trajectory]:
    """A checkpoint's own trajectories of its last rollout, with their local token ids."""
    return {r["trajectory_id"]: _trajectory_from_record(r) for r in state["own_trajectories"]}


def _trainable_state(model: Any) -> dict[str, torch.Tensor]:
    """Full weights for full fine-tuning; only the adapter (trainable) tensors for LoRA."""
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items() if k in trainable or not trainable}


def _trajectory_record(t: Trajectory) -> dict:
    record = {k: getattr(t, k) for k in t.__dataclass_fields__ if k not in ("prompt", "response_token_ids")}
    record["prompt"] = [[m.role, m.content] for m in t.prompt]
    record["response_token_ids"] = list(t.response_token_ids or ())
    return record


def _trajectory_from_record(record: dict) -> Trajectory:
    data = dict(record)
    data["prompt"] = tuple(ChatMessage(r, c) for r, c in data["prompt"])
    data["response_token_ids"] = tuple(data["response_token_ids"])
    return Trajectory(**data)
