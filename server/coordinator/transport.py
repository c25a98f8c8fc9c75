"""The transport interface and its in-process implementation (docs/design.md "An in-process transport").

Runs in the coordinator's process: the in-process loop drives `hacfed sim`, tests and benchmarks;
the Flower transport is `hacfed.server.serverapp` + `hacfed.server.driver`.

One exchange per round: the coordinator sends each participant a `RoundUpdate` {pool and
capabilities of round r-1, plan of round r}, the pool being the participant's share of it (its own
samples and at most `pool_peers_per_prompt` peers per prompt, `pool_share`: what the Flower driver
sends it too); the participant trains on the pool, rolls out the plan
and answers with a `Submission`. `run_rounds` drives that loop with direct calls, for tests,
`hacfed sim` and benchmarks; the Flower transport implements the same exchange across processes
with deadlines and retries.

    outcomes = run_rounds(coordinator, [participant_a, participant_b], on_round=print_summary)

A participant that raises or answers nothing does not stall a round: it is logged and the round
closes by quorum or at its deadline (waited for with `sleep`, which a test replaces with a fake clock
that advances). After the last round, a final update (pool of the last round, no plan) lets every
participant train on that pool and send a final report.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Protocol, Sequence, runtime_checkable

from hacfed.messages import RoundUpdate, Submission
from hacfed.server.coordinator.metrics import RoundSummary
from hacfed.server.coordinator.pool_share import share_salt, shares_of
from hacfed.server.coordinator.results import RoundClosed, SubmissionResult
from hacfed.server.coordinator.state import Coordinator

log = logging.getLogger("hacfed.server.coordinator.transport")
_MAX_WAITS = 10_000  # a `sleep` that never advances the clock must not hang the caller forever


@runtime_checkable
class ParticipantEndpoint(Protocol):
    """One participant as the coordinator sees it. `exchange` returns None when it has nothing to
    submit (e.g. the final update, or a participant that is down)."""

    participant_id: str

    def exchange(self, update: RoundUpdate) -> Submission | None: ...


@dataclass(frozen=True)
class RoundOutcome:
    round_id: int
    closed: RoundClosed
    results: Mapping[str, SubmissionResult]  # participant -> what its submission got
    failures: Mapping[str, str]  # participant -> why it produced no submission
    summary: RoundSummary


def run_rounds(
    coordinator: Coordinator,
    endpoints: Sequence[ParticipantEndpoint],
    rounds: int | None = None,
    on_round: Callable[[RoundOutcome], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> list[RoundOutcome]:
    """Run up to `rounds` more rounds (default: to the end of the run), resuming where the journal
    stands. Returns one outcome per round closed by this call."""
    ids = [ep.participant_id for ep in endpoints]
    if len(set(ids)) != len(ids):
        raise ValueError(f"participant ids must be unique, got {ids}")
    if rounds is not None and (isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0):
        raise ValueError(f"rounds must be an int >= 0 or None, got {rounds!r}")
    coordinator.resume()
    for pid in ids:
        coordinator.register(pid)
    first = coordinator.current_round if coordinator.current_round is not None else coordinator.next_round_id
    last = coordinator.cfg.rounds if rounds is None else min(coordinator.cfg.rounds, first + rounds)
    outcomes: list[RoundOutcome] = []
    while True:
        round_id = coordinator.current_round
        if round_id is None:
            if coordinator.next_round_id >= last:
                break
            round_id = coordinator.open_round().round_id
        outcome = _run_one_round(coordinator, endpoints, round_id, sleep)
        outcomes.append(outcome)
        if on_round is not None:
            on_round(outcome)
    if outcomes and coordinator.finished:
        _send_final_update(coordinator, endpoints)
    return outcomes


def _run_one_round(
    coordinator: Coordinator, endpoints: Sequence[ParticipantEndpoint], round_id: int, sleep: Callable[[float], None]
) -> RoundOutcome:
    update_for = _updates(coordinator, round_id)
    quarantined = {p.participant_id for p in coordinator.participants() if p.quarantined}
    results: dict[str, SubmissionResult] = {}
    failures: dict[str, str] = {}
    for ep in endpoints:
        pid = ep.participant_id
        if pid in quarantined:
            failures[pid] = "quarantined"
            continue
        if coordinator.has_submitted(pid, round_id):  # answered before a coordinator restart
            continue
        submission = exchange_with(ep, update_for(pid), failures)
        if submission is not None:
            results[pid] = coordinator.submit(submission, sender=pid)
    reason = wait_until_closable(coordinator, sleep)
    closed = coordinator.close_round(reason)
    return RoundOutcome(round_id, closed, results, failures, coordinator.round_summary(round_id))


def exchange_with(ep: ParticipantEndpoint, update: RoundUpdate, failures: dict[str, str]) -> Submission | None:
    """One participant's turn. Its failure is an expected event for a federation (security.md T10),
    so it is logged and recorded, and the round goes on without it."""
    try:
        submission = ep.exchange(update)
    except Exception as exc:  # noqa: BLE001 - any participant failure must not stop the others
        log.warning(
            "participant %s failed on the update after round %s: %s",
            ep.participant_id, update.pool_round, exc, exc_info=True,
        )
        failures[ep.participant_id] = f"{type(exc).__name__}: {exc}"
        return None
    if submission is None:
        failures[ep.participant_id] = "no submission"
    return submission


def wait_until_closable(coordinator: Coordinator, sleep: Callable[[float], None]) -> str:
    for _ in range(_MAX_WAITS):
        reason = coordinator.poll()
        if reason is not None:
            return reason
        record = coordinator.round_record(coordinator.current_round)
        sleep(max(record.deadline - coordinator.now(), 0.0))
    raise RuntimeError(
        f"round {coordinator.current_round} never became closable: does `sleep` advance the coordinator's clock?"
    )


def _updates(coordinator: Coordinator, round_id: int) -> Callable[[str], RoundUpdate]:
    """Each participant's update for `round_id`: the pool share a Flower coordinator would send it
    (its own samples and at most `pool_peers_per_prompt` peers per prompt, `pool_share`)."""
    cfg = coordinator.cfg
    update = coordinator.make_update(round_id)
    return shares_of(update, cfg.pool_peers_per_prompt, share_salt(cfg.run_id, cfg.seed, round_id),
                     cfg.pool_peer_choice, coordinator.intake.group_credit(update.pool_round))


def _send_final_update(coordinator: Coordinator, endpoints: Sequence[ParticipantEndpoint]) -> None:
    update_for = _updates(coordinator, coordinator.cfg.rounds)
    quarantined = {p.participant_id for p in coordinator.participants() if p.quarantined}
    failures: dict[str, str] = {}
    for ep in endpoints:
        if ep.participant_id in quarantined:
            continue
        submission = exchange_with(ep, update_for(ep.participant_id), failures)
        if submission is not None:
            problem = coordinator.record_final_report(submission, sender=ep.participant_id)
            if problem is not None:
                log.warning("final report of %s refused: %s %s", ep.participant_id, problem.code, problem.detail)
