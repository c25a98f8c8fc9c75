"""The coordinator's side of the real federation: a `RoundDriver` for hacfed's Flower ServerApp.

    run config: driver = "hacfed.server.driver:make_driver", driver-config = <state>/driver-settings.json

hacfed-server writes its `ServerConfig` there and submits the run; the SuperLink starts the ServerApp, whose
`RoundLoop` (hacfed.server.serverapp) asks this driver for payloads at every poll, hands it every reply or error
(each ends an exchange), and asks it to close what may close. The driver owns a `Coordinator` over the journal
in the server's state dir, so a restarted ServerApp (or hacfed-server) resumes where the journal stands.

One coordinator round may take several exchanges: a participant whose exchange failed (down, unreachable, timed out)
is sent the same round again after `retry_interval_s` until it submits or the round closes (quorum, or the deadline
with its extensions: Coordinator.poll). With `max_staleness` K >= 1 or `round_join = "newest"` each lab is at its
own step and is sent its next one as soon as it may start it (`hacfed.server.stale_rounds`, the coordinator's
`engine`; docs/staleness.md). Rounds open when enough registered
participants are connected: the first round waits up to one deadline for `expected_participants`, later rounds start
with `min_participants`; whoever is late joins the open round or the next one. After the last round a plan-less
update collects the final reports (`hacfed.server.run_end`). The driver owns the rounds (opening, closing, what each
lab is sent); its collaborators own the rest: `Deliveries` (in flight, retry times, sealing), `Hellos` (which lab a
node is), `RoundMembers` (whom rounds count on), `LabReplies` (judging replies), `RunEnd` (final reports and
acknowledgements), `SealedUpdates`.

Everything sent to a lab is a signed `Delivery` (hacfed.exchange): the answers to its earlier submissions (signed
receipts and refusals, `hacfed.server.answers`) plus this exchange's request (or only the answers, to an idle lab).
A lab's `LabReply` (its submission and its outbox's unacknowledged ones) is judged by `LabReplies`.

A Flower node takes part once its hello proved which registered lab it is (`hacfed.server.hellos`). The registry is
re-read before each round and reply: a revoked lab is sent nothing more, its reply is refused, rounds stop waiting
for it. While the state dir lacks its free-space headroom the driver pauses (`hacfed.server.headroom`). Never
imports torch (docs/design.md): `driver-status.json` records `'torch' in sys.modules`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager

from hacfed.crashpoints import crash_point
from hacfed.envelope import load_private_key
from hacfed.flower_pulls import reply_content_wait_s, shorten_pull_retries
from hacfed.identity import is_participant_id
from hacfed.server.allocator import keep_freed_memory
from hacfed.server.answers import AnswerQueue
from hacfed.server.collector import freeze_startup_objects
from hacfed.server.config import ServerConfig, read_server_config
from hacfed.server.console_log import ConsoleLog
from hacfed.server.coordinator import Coordinator, Journal, load_task_from_config
from hacfed.server.coordinator.audit import AuditLog
from hacfed.server.coordinator.errors import AuditError, safe_text
from hacfed.server.deliveries import ACK, ANSWERS, FINAL, Deliveries, what
from hacfed.server.disk_space import held_detail
from hacfed.server.driver_settings import CONSOLE_FILE, Supervisor, SupervisorGone, parse_supervisor, supervisor_alive
from hacfed.server.headroom import Headroom, is_no_space
from hacfed.server.hellos import Hellos
from hacfed.server.membership import Membership
from hacfed.server.node_auth import BINDINGS_FILE
from hacfed.server.replies import LabReplies
from hacfed.server.round_members import RoundMembers
from hacfed.server.round_report import RoundReport
from hacfed.server.round_updates import SealedUpdates
from hacfed.server.round_waiting import WaitingLine
from hacfed.server.run_end import RunEnd, write_status
from hacfed.server.serverapp import LoopTiming
from hacfed.server.stale_rounds import StaleRounds

log = logging.getLogger("hacfed.server.driver")


class FailedClosed(RuntimeError):
    """The audit log or the journal cannot be written: the coordinator stops accepting (S10). The
    ServerApp ends; hacfed-server resubmits it a few times (it resumes once the log is writable
    again) and otherwise exits non-zero. Unacknowledged submissions stay in the labs' outboxes."""


class FederationDriver:
    def __init__(
        self, config: ServerConfig, *, supervisor: Supervisor | None = None, clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic, console: Callable[[str], None] | None = None,
    ) -> None:
        self.config, self.supervisor, self.cfg = config, supervisor, config.coordinator  # supervisor: hacfed-server
        self.state_dir = config.state_dir
        self._monotonic = monotonic
        self.console = ConsoleLog(self.state_dir / CONSOLE_FILE, console)
        self.journal = Journal(self.cfg.journal_path, audit=AuditLog(self.cfg.audit_path))
        self.coordinator = Coordinator(self.cfg, load_task_from_config(self.cfg, str(config.config_dir)),
                                       self.journal, clock=clock, sent_journaled=True)
        self.timing = LoopTiming(config.server.poll_interval_s, self.cfg.round_deadline_s)  # the round loop's
        self._key = load_private_key(config.coordinator_key)
        self.answers = AnswerQueue(self._key, self.cfg.run_id)
        self.membership = Membership(config.keys_dir, self.console,
                                     trust_on_first_use=config.server.trust_on_first_use,
                                     bindings_path=self.state_dir / BINDINGS_FILE if config.supernode_auth else None)
        self.report = RoundReport(self.coordinator, config.metrics_out, self.console, monotonic)
        self.deliveries = Deliveries(self._key, self.answers, monotonic)
        self.updates = SealedUpdates(self.cfg, self.coordinator, self._key, self.console)
        self.stale = StaleRounds(self.coordinator, self._key, self.deliveries, self.console) \
            if self.coordinator.engine.journaled else None  # K >= 1 or round_join "newest": each lab's steps
        self.hellos = Hellos(self._key, self.cfg.run_id, self.membership, monotonic)
        self.run_end = RunEnd(self.cfg, self.coordinator, self.journal, self.membership, self.deliveries, self._key,
                              self.console, monotonic, config.metrics_out)
        self.replies = LabReplies(
            coordinator=self.coordinator, journal=self.journal, membership=self.membership, answers=self.answers,
            deliveries=self.deliveries, run_end=self.run_end, key=self._key, rounds=self.cfg.rounds,
            console=self.console, monotonic=monotonic, on_step_times=self.report.record_steps,
        )
        self._nodes: dict[int, str] = {}  # node id -> participant id (the loop's hellos)
        self._last_error: dict[str, str] = {}
        self.members = RoundMembers(self.coordinator, self.membership, self.console)  # whom rounds count on
        self._registered: set[str] = set()  # registered with the coordinator by this driver
        self._connected: set[str] = set()  # admitted participants the loop currently knows
        self._waiting_since: float | None = None  # since when the next round waits for participants
        self._waiting_line = WaitingLine(self.console)  # every 30 s: whom an open round waits for
        self.headroom = Headroom(self.state_dir, config.server.min_free_mib, self.console, monotonic,
                                 on_resume=self._hold_deadlines)
        self._resume()

    def _hold_deadlines(self, paused_s: float) -> None:
        """Space is back after `paused_s` paused: the open rounds' deadlines move as much later."""
        with self._fail_closed_guard():
            for round_id in self.journal.hold_deadlines(paused_s, self.coordinator.now(), held_detail(paused_s)):
                self.console(f"round {round_id}: deadline held {paused_s:.0f}s (the time paused)")

    # -- RoundDriver ----------------------------------------------------------------------------

    @contextmanager
    def _fail_closed_guard(self) -> Iterator[None]:
        """Stop the ServerApp as soon as the coordinator failed closed (an audit or journal write failed)."""
        try:
            yield
        except AuditError as exc:
            self.coordinator.failed_closed = self.coordinator.failed_closed or str(exc)
        if self.coordinator.failed_closed is not None and is_no_space(self.coordinator.failed_closed):
            self.console(f"WRITE FAILED: {self.coordinator.failed_closed}. No space: the ServerApp stops; "
                         f"hacfed-server pauses and runs it again once {self.state_dir} can be written")
            raise FailedClosed(self.coordinator.failed_closed)
        if self.coordinator.failed_closed is not None:
            self.console(f"WRITE FAILED: {self.coordinator.failed_closed}. The coordinator accepts nothing more (fail "
                         f"closed): make {self.state_dir} writable (free space, permissions, file-size limit), check "
                         f"it with `hacfed-server audit verify`, and restart hacfed-server")
            raise FailedClosed(self.coordinator.failed_closed)

    def next_round(self, participants: Mapping[int, str]) -> Mapping[int, bytes] | None:
        with self._fail_closed_guard():
            return self._next_round(participants)

    def _next_round(self, participants: Mapping[int, str]) -> Mapping[int, bytes] | None:
        if not supervisor_alive(self.supervisor):
            self.console("hacfed-server is gone: the ServerApp stops (restart hacfed-server to resume)")
            raise SupervisorGone(f"hacfed-server (pid {self.supervisor[0]}) is gone")
        if self.headroom.paused():  # the state dir's disk is (nearly) full: open, close and send nothing
            return None
        with self.report.timed():
            return self._payloads(participants)

    def _payloads(self, participants: Mapping[int, str]) -> Mapping[int, bytes] | None:
        admitted = self._admit(participants)
        unknown = {pid for pid in self._nodes.values() if not self.membership.known(pid)}
        payloads = self.replies.key_requests(self._nodes, unknown)
        if self.run_end.done:
            return payloads or None
        if self.coordinator.current_round is not None and (reason := self.coordinator.poll()) is not None:
            self._close(reason)
        if self.coordinator.current_round is None and not self.coordinator.finished:
            self._maybe_open(admitted)
        if self.coordinator.current_round is not None:
            payloads.update(self._round_payloads(admitted))
            self._waiting_line.tick(self.coordinator, self.coordinator.open_rounds()[0], self._monotonic())
        elif self.coordinator.finished:
            payloads.update(self._final_payloads(admitted))
        payloads.update(self._answer_deliveries(admitted, set(payloads)))
        return payloads or None

    def _admit(self, participants: Mapping[int, str]) -> set[str]:
        """The admitted labs among the loop's nodes (the registry re-read if it changed), joins and
        leaves named on the console; `_nodes` becomes the nodes that may be sent something."""
        admitted = self.membership.admit(participants)
        self.members.refresh()  # revoked (or on another task): rounds stop waiting for them
        for pid in sorted(admitted - self._connected):
            self.console(f"{'rejoined' if pid in self._registered else 'joined'}: {pid}")
            self.coordinator.register(pid)  # idempotent; a quarantined participant stays so
            self._registered.add(pid)
        for pid in sorted(self._connected - admitted):
            self.console(f"left: {pid} (its Flower node is gone)" if self.membership.known(pid) else
                         f"revoked: {pid} is no longer registered: it is sent nothing more and its submissions "
                         f"are refused")
        self._connected = set(admitted)
        # Only admitted participants get rounds; with trust on first use an unknown (valid) id also gets
        # a key request. A revoked lab's node stays mapped by the loop, but is sent nothing.
        self._nodes = {node: pid for node, pid in participants.items() if pid in admitted or (
            self.membership.trust_on_first_use and is_participant_id(pid) and not self.membership.known(pid))}
        return admitted

    def hello(self, node_id: int) -> bytes:
        """The payload of a hello to `node_id` (`Hellos.hello`)."""
        return self.hellos.hello(node_id)

    def identify(self, node_id: int, participant_id: str, proof: bytes) -> bool:
        """True when node `node_id` may be participant `participant_id` (`Hellos.identify`)."""
        if not self.hellos.identify(node_id, participant_id, proof):
            return False
        self.members.rejoined(participant_id)
        return True

    def on_replies(self, replies: Iterable[tuple[int, bytes]]) -> None:
        """The replies of one pull, in order. Each lab's submission is begun (`Coordinator.begin_submit`:
        gates, cheap checks, reward verification sent to the verifier's workers) before the one
        before it is finished (verdicts, journal, answer), so the workers verify one lab's samples
        while this thread decodes and checks the next lab's (bench/coordinator_scale.py). Every
        submission is journaled and answered before this returns."""
        with self._fail_closed_guard():
            try:
                for node_id, payload in replies:
                    self._on_reply(node_id, payload)
                    self._timed_finish(keep=1)
            finally:
                self._timed_finish(keep=0)

    def _timed_finish(self, keep: int) -> None:
        with self.report.timed():
            self.replies.finish_judging(keep)

    def _on_reply(self, node_id: int, payload: bytes) -> None:
        with self.report.timed():
            self._judge_reply(node_id, payload, self._monotonic())

    def _judge_reply(self, node_id: int, payload: bytes, started: float) -> None:
        sent = self.deliveries.take(node_id)
        if sent is None:
            log.warning("ignoring a reply from node %s that was sent nothing", node_id)
            return
        pid = sent.participant_id
        self.membership.refresh()  # a lab revoked since it was sent this exchange is refused here
        if sent.round_id is None:
            self.replies.accept_key_offer(pid, payload)
        elif not self.membership.known(pid):
            self.replies.refuse(sent, "HACFED-E-UNAUTHENTICATED", f"{pid} is no longer registered (revoked)")
        else:
            if sent.answers:  # the lab replied to the delivery: it holds these receipts and refusals
                self.answers.delivered(pid, sent.answers)
                crash_point("after_ack")
            if sent.round_id == ACK:
                self.run_end.acknowledged(pid)
            else:
                self.replies.take(sent, payload, started - sent.at)

    def on_error(self, node_id: int, error: str) -> None:
        sent = self.deliveries.take(node_id)
        if sent is None:
            return
        pid = sent.participant_id
        if sent.round_id == ACK:  # the participant may leave as soon as it has the ack: no retry
            self.run_end.acknowledged(pid)
            return
        if sent.round_id == ANSWERS:  # its answers stay queued; try again after the interval
            self.deliveries.hold_answers(pid, self.config.server.retry_interval_s)
            return
        if self.members.failed(pid, error):  # on another task: not sent this round again, not waited for
            return
        self.deliveries.hold(pid, self.config.server.retry_interval_s)
        if self._last_error.get(pid) != error:  # a participant that stays down is named once
            self._last_error[pid] = error
            self.console(f"{what(sent)} {pid}: exchange failed: {safe_text(error, 300)}")

    def close_round(self) -> None:
        if self.headroom.paused():  # nothing is closed (or written) until the state dir has room again
            return
        with self.report.timed(), self._fail_closed_guard():
            if self.coordinator.current_round is not None and (reason := self.coordinator.poll()) is not None:
                self._close(reason)
            elif self.coordinator.finished and not self.run_end.done:
                self.run_end.maybe_finish(self._nodes)

    def finished(self) -> bool:
        return self.run_end.done

    # -- rounds ---------------------------------------------------------------------------------

    def _maybe_open(self, admitted: set[str]) -> None:
        connected = len(self.members.active(admitted))
        first = self.coordinator.next_round_id == 0
        needed = self.cfg.expected_participants if first else self.cfg.min_participants
        if connected < needed:
            now = self._monotonic()
            if self._waiting_since is None:
                self._waiting_since = now
                fallback = first and self.cfg.min_participants < needed
                or_fewer = f" (or {self.cfg.min_participants} after {self.cfg.round_deadline_s:.0f}s)"
                self.console(f"waiting for participants: {connected} connected, round "
                             f"{self.coordinator.next_round_id} starts with {needed}{or_fewer if fallback else ''}")
            grace_over = first and connected >= self.cfg.min_participants and \
                now - self._waiting_since >= self.cfg.round_deadline_s
            if not grace_over:
                return
        self._waiting_since = None
        plan = self.coordinator.open_round()
        self.report.opened()
        self._last_error = {}
        self.deliveries.clear_holds()
        self.console(f"round {plan.round_id} open: {len(plan.prompts)} prompts x G={plan.group_size}"
                     f"{' (+ evaluation)' if plan.evaluate else ''}, deadline {self.cfg.round_deadline_s:.0f}s")

    def _targets(self, admitted: set[str], done: Callable[[str], bool]) -> dict[int, str]:
        now, busy = self._monotonic(), self.deliveries.busy()
        active = self.members.active(admitted)
        return {node: pid for node, pid in self._nodes.items()
                if pid in active and pid not in busy and not done(pid) and self.deliveries.may_ask(pid, now)}

    def _round_payloads(self, admitted: set[str]) -> dict[int, bytes]:
        if self.stale is not None:  # K >= 1 or round_join "newest": each lab at its own step
            return self.stale.payloads(self._targets(admitted, lambda pid: False))
        round_id = self.coordinator.current_round
        targets = self._targets(admitted, lambda pid: self.coordinator.has_submitted(pid, round_id))
        return self.deliveries.send(targets, round_id, self.updates.for_round(round_id)) if targets else {}

    def _final_payloads(self, admitted: set[str]) -> dict[int, bytes]:
        """After the last round: the acknowledgements due, and the plan-less update to every active
        lab that has not reported yet; when there is nothing to send, the run may be done."""
        payloads = self.run_end.ack_payloads(self._nodes)
        reported = set(self.run_end.final_reports())
        targets = self._targets(admitted, lambda pid: pid in reported)
        if targets and self.stale is not None:
            payloads.update(self.stale.final_payloads(targets))
        elif targets:
            payloads.update(self.deliveries.send(targets, FINAL, self.updates.for_round(self.cfg.rounds)))
        if not payloads:
            self.run_end.maybe_finish(self._nodes)
        return payloads

    def _answer_deliveries(self, admitted: set[str], taken: set[int]) -> dict[int, bytes]:
        """Answers-only deliveries for idle labs whose answers would otherwise wait."""
        now, busy = self._monotonic(), self.deliveries.busy()
        targets = {node: pid for node, pid in self._nodes.items()
                   if node not in taken and pid in admitted and pid not in busy and self.answers.pending(pid)
                   and self.deliveries.may_send_answers(pid, now)}
        return self.deliveries.send(targets, ANSWERS, b"")

    def _close(self, reason: str) -> None:
        round_id = self.coordinator.open_rounds()[0]  # the oldest open round closes (max_staleness K: of K + 1)
        opened_at = self.coordinator.round_record(round_id).opened_at
        self.report.closed(round_id, opened_at, self.coordinator.close_round(reason), set(self._nodes.values()))
        self.deliveries.forget_round(round_id)
        write_status(self.state_dir, self.coordinator, self.run_end.done)
        if self.coordinator.finished:
            self.run_end.start()
            self.deliveries.clear_holds()
            self._last_error = {}
            self.console(f"all {self.cfg.rounds} rounds done: collecting final reports")

    # -- resume ---------------------------------------------------------------------------------

    def _resume(self) -> None:
        resumed = self.coordinator.resume()
        self.report.rows_missing_after_resume()
        where = (f"round {resumed.open_round} continues (same id and deadline)" if resumed.open_round is not None
                 else "all rounds done" + ("" if self.run_end.done else "; final reports pending")
                 if self.coordinator.finished else f"next round {resumed.next_round}")
        closed = resumed.closed_on_resume
        self.console(f"coordinator ready (run {self.cfg.run_id}): {where}"
                     f"{f'; round {closed.round_id} closed at its passed deadline' if closed else ''}")
        if self.coordinator.finished and not self.run_end.done:
            self.run_end.resume()  # labs that reported before the restart may still wait for their ack
        write_status(self.state_dir, self.coordinator, self.run_end.done)


def make_driver(run_config: Mapping[str, object]) -> FederationDriver:
    """The ServerApp's factory (run config `driver`): `driver-config` names the ServerConfig file."""
    path = run_config.get("driver-config")
    if not isinstance(path, str) or not path:
        raise ValueError(f"run config 'driver-config' must name the server config file, got {path!r}")
    from flwr.superlink.grid import grpc_grid

    config = read_server_config(path)  # the ServerApp's Grid: a reply's content still arriving is retried
    shorten_pull_retries(grpc_grid, [grpc_grid.GrpcGrid.pull_messages],  # after 20 ms, not 1 s; given up
                         max_time_s=reply_content_wait_s(config.coordinator.round_deadline_s))  # past the bound
    driver = FederationDriver(config, supervisor=parse_supervisor(run_config.get("supervisor", "")))
    keep_freed_memory()
    freeze_startup_objects()
    return driver
