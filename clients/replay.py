"""A lab's side of a purge (security.md "Nothing lost", R11): roll back to the last checkpoint that never
trained on the purged participant's samples, and train again on the pools since, without them.

Runs in `hacfed-client replay` (a lab's process, while its hacfed-client is stopped), after the
coordinator's operator ran `hacfed-server purge --participant X --from-round R`:

    hacfed-client replay --config lab.toml --exclude lab-x --from-round 4   # the lab's usual flags

A lab trains on the pool of round k when it answers the update that carries it (and the plan of
round k + 1), so the checkpoint written after that step holds pools <= k. The clean checkpoint is
the newest one whose last pool is < R. Every pool after it, up to the newest checkpoint's, is taken
from the signed round updates the lab's outbox kept (`hacfed.clients.outbox`, each signature checked
again with the coordinator's key), X's samples and X's capability are removed, and the participant
trains on each in order with the same code as a round (`Participant.train_on_pool`), from the clean
checkpoint's weights, optimizer and RNG state: the result is deterministic. Own samples get their
local token ids from the checkpoint of the round that rolled them out when it is still kept (else
they are re-tokenized like another lab's). No rollout or evaluation runs again: the submissions the
lab made stay what they were. The result is saved as a new checkpoint (`ckpt-<round>-replay`) with
the same round progress as before, so hacfed-client resumes from it.

How far back this reaches is bounded by `keep_checkpoints` (a clean checkpoint must still exist).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from hacfed.clients.checkpoints import checkpoints, latest_checkpoint, own_trajectories, pool_round_of, read_state
from hacfed.clients.outbox import Outbox
from hacfed.envelope import DOMAIN_UPDATE, key_id, open_envelope
from hacfed.messages import RoundUpdate
from hacfed.wire import PayloadType, WireError, decode_round_update

if TYPE_CHECKING:  # torch and the model stack: the participant's own module
    from hacfed.clients.participant import Participant


class ReplayError(ValueError):
    """The replay cannot run (no clean checkpoint kept, an update missing, a bad signature)."""


@dataclass(frozen=True)
class ReplayReport:
    clean_checkpoint: str  # the checkpoint the lab rolled back to
    pools: tuple[int, ...]  # the pool rounds trained on again
    excluded: dict[int, int]  # pool round -> samples of the purged participant left out
    checkpoint: str | None  # the new checkpoint (None: nothing to replay)


def plan_replay(checkpoint_dir: Path, outbox: Outbox, coordinator_key: Ed25519PublicKey, exclude: str,
                from_round: int) -> tuple[Path, Path, list[RoundUpdate]]:
    """(clean checkpoint, newest checkpoint, the verified updates to train on again, in order)."""
    latest = latest_checkpoint(checkpoint_dir)
    if latest is None:
        raise ReplayError(f"no checkpoint in {checkpoint_dir}: nothing to roll back")
    target = pool_round_of(read_state(latest))
    clean = [c for c in checkpoints(checkpoint_dir) if (p := pool_round_of(read_state(c))) is None or p < from_round]
    if not clean:
        kept = [c.name for c in checkpoints(checkpoint_dir)]
        raise ReplayError(f"no kept checkpoint predates round {from_round} (kept: {kept}); a purge can roll a lab "
                          f"back only as far as its keep_checkpoints")
    start = pool_round_of(read_state(clean[-1]))
    trusted = {key_id(coordinator_key): coordinator_key}
    updates: dict[int, RoundUpdate] = {}
    for key, envelope in outbox.received_updates():
        pool_round = key[1]
        if pool_round is None or target is None or not (start if start is not None else -1) < pool_round <= target:
            continue
        try:
            payload, _ = open_envelope(envelope, trusted, DOMAIN_UPDATE, PayloadType.ROUND_UPDATE)
            updates[pool_round] = decode_round_update(payload)
        except WireError as exc:
            raise ReplayError(f"the kept update with the pool of round {pool_round} does not verify: {exc}") from None
    wanted = range((start if start is not None else -1) + 1, (target if target is not None else -1) + 1)
    missing = [r for r in wanted if r not in updates]
    if missing:
        raise ReplayError(f"{outbox.path} does not hold the updates with the pools of rounds {missing}")
    return clean[-1], latest, [updates[r] for r in wanted]


def without(update: RoundUpdate, exclude: str) -> RoundUpdate:
    """The update as if `exclude` had never taken part: its samples, capability and name removed."""
    return dataclasses.replace(
        update,
        pool=tuple(t for t in update.pool if t.source_id != exclude),
        capabilities={k: v for k, v in update.capabilities.items() if k != exclude},
        participants=tuple(p for p in update.participants if p != exclude),
    )


def replay(
    participant: Participant, checkpoint_dir: Path, outbox: Outbox, coordinator_key: Ed25519PublicKey, exclude: str,
    from_round: int, say: Callable[[str], None] = lambda line: None,
) -> ReplayReport:
    """Roll `participant` back and train again; see the module docstring."""
    checkpoint_dir = Path(checkpoint_dir)
    clean, latest, updates = plan_replay(checkpoint_dir, outbox, coordinator_key, exclude, from_round)
    excluded = {u.pool_round: sum(t.source_id == exclude for t in u.pool) for u in updates}
    if not any(excluded.values()):
        say(f"none of the pools trained on since {clean.name} holds samples of {exclude}: nothing to replay")
        return ReplayReport(clean.name, (), excluded, None)
    latest_state = read_state(latest)
    kept_own = {pool_round_of(read_state(c)): own_trajectories(read_state(c)) for c in checkpoints(checkpoint_dir)}
    participant.resume(checkpoint_dir, clean)  # weights, optimizer, RNG, own samples of that round
    say(f"rolled back to {clean.name}; training again on the pools of rounds {[u.pool_round for u in updates]} "
        f"without {exclude}'s samples ({sum(excluded.values())} left out)")
    for update in updates:
        clean_update = without(update, exclude)
        participant.capabilities = dict(clean_update.capabilities)
        metrics = participant.train_on_pool(clean_update)
        say(f"pool of round {update.pool_round}: trained on {len(clean_update.pool)} samples "
            f"(left out {excluded[update.pool_round]}), {int(metrics.get('num_updates', 0))} updates")
        # the own samples of the next pool were rolled out right after this step: their token ids
        participant.own_samples = kept_own.get(update.pool_round, {})
    participant.last_round = None if latest_state["round"] < 0 else int(latest_state["round"])
    participant.last_pool_round = pool_round_of(latest_state)
    participant.own_samples = own_trajectories(latest_state)
    saved = participant.save(checkpoint_dir, suffix="-replay")
    say(f"saved {saved.name} (policy version {participant.policy_version}); hacfed-client resumes from it")
    return ReplayReport(clean.name, tuple(u.pool_round for u in updates), excluded, saved.name)


def run_replay(cfg: Any, exclude: str, from_round: int, say: Callable[[str], None]) -> int:
    """`hacfed-client replay`: the lab's configuration (`ClientConfig`), hacfed-client stopped."""
    import fcntl

    from hacfed.clients.service import OUTBOX_FILE
    from hacfed.envelope import load_public_key

    if from_round < 0:
        raise ValueError(f"--from-round must be >= 0, got {from_round}")
    state = cfg.state_dir
    checkpoint_dir = Path(cfg.participant.checkpoint_dir)
    outbox_path = state / "service" / OUTBOX_FILE
    if not outbox_path.is_file() or latest_checkpoint(checkpoint_dir) is None:
        raise ValueError(f"{state} holds no outbox or checkpoint of a lab: is it this lab's --state-dir?")
    lock = open(state / "client.lock", "w")  # noqa: SIM115 - held while replaying
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise ValueError(f"hacfed-client is running with state dir {state}: stop it before replaying") from None
    try:
        outbox = Outbox(outbox_path)
        coordinator_key = load_public_key(cfg.coordinator_key)
        plan_replay(checkpoint_dir, outbox, coordinator_key, exclude, from_round)  # fail before loading a model
        from hacfed.clients.participant import Participant  # torch
        from hacfed.tasks.registry import load_task

        task = load_task(cfg.task, base_dir=cfg.config_dir)
        participant = Participant.from_spec(cfg.participant, task)
        report = replay(participant, checkpoint_dir, outbox, coordinator_key, exclude, from_round, say)
        if report.checkpoint is None:
            say("nothing changed")
        return 0
    except ReplayError as exc:
        raise ValueError(str(exc)) from None
    finally:
        lock.close()
