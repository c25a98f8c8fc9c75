"""What hacfed-client does once its configuration is valid (`ClientConfig` checked the model spec,
addresses, ids and key files; the task is loaded here before anything is created).

1. keys: `<state-dir>/participant.key` and `supernode.key` (+ `.pub`) and the enrolment line for the
   coordinator's operator, `<state-dir>/enrolment.txt` (`hacfed.clients.enrol`), created on first start;
   the line is printed too, ready for `hacfed-server register`;
2. the model, resident for the whole run (torch is imported here, after the config was checked),
   resuming from `<state-dir>/checkpoints` after a restart;
3. the participant service on a private Unix socket (`hacfed.clients.service`, behind the relay's gRPC);
4. a Flower SuperNode pointed at the coordinator (with TLS: authenticated with the lab's SuperNode
   key), supervised: restarted if it exits (also when its heartbeat died, e.g. on a coordinator whose
   disk was full: `hacfed.clients.supernode.HEARTBEAT_LOST_EXIT`), and restarted to find out why if
   the coordinator cut it off (revoked); a refusal to connect is named in one line.
It exits 0 once the coordinator acknowledged its final report (or quarantined it) and the
SuperNode has sent the answer to that acknowledgement; with --stay it keeps serving. It exits 2,
saying why in one line, once the coordinator refused this lab as it is (its id is not registered,
or its task is not the coordinator's) and the SuperNode has sent the answer it was in the middle of.

What the lab sees on its console: each round it answered, the coordinator's receipt or refusal
(code and message) for every submission, and, while the coordinator is unreachable, each reconnect
attempt of the SuperNode (`hacfed.clients.backoff`: 1 s x1.6, jitter, at most 30 s).
"""

from __future__ import annotations

import fcntl
import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from hacfed.clients.backoff import RECONNECT_MARK
from hacfed.clients.config import ClientConfig
from hacfed.clients.enrol import ensure_lab_keys
from hacfed.clients.local_socket import relay_socket_place
from hacfed.clients.outbox import Outbox
from hacfed.clients.relay import serve_participant_unix
from hacfed.clients.service import OUTBOX_FILE, Answered, ParticipantService
from hacfed.clients.supernode import HEARTBEAT_LOST_EXIT, SuperNode, heartbeat_lost_reason, start_supernode
from hacfed.clients.transport_probe import TransportWatch
from hacfed.enrolment import ENROLMENT_FILE, SUPERNODE_KEY
from hacfed.envelope import load_public_key
from hacfed.leftovers import forget_children, kill_leftovers, record_children
from hacfed.metrics_sinks import MetricsLogger, open_logger, step_row
from hacfed.procs import ProcessError, ProcessSupervisor
from hacfed.truncation_warnings import TruncationWarnings

METRICS_FILE = "metrics.jsonl"  # the lab's own rows (hacfed.metrics_sinks.step_row), read by `hacfed report`
_SENT = re.compile(r"Sent successfully|Failed to send|is not in `RUNNING` status")
_STOCK_RETRY = "Connection attempt failed, retrying in"  # stock flower-supernode (idle_poll_s unset)
BUDGET_SETTING = "max_new_tokens in the coordinator's [sampling] (its operator's setting)"  # the plan's budget
# After the answer to a refusal has left: how long the SuperNode stays up. A SuperNode that stops takes
# the replies the coordinator has not pulled yet with it (the coordinator then sees only "node
# unavailable", not why), and the coordinator pulls between its other round work, which can take a while.
REFUSAL_LINGER_S = 5.0


def say(text: str) -> None:
    print(f"hacfed-client: {text}", flush=True)


def describe_answer(answered: Answered, participant_id: str) -> str:
    update, sub = answered.update, answered.submission
    plan = update.next_plan
    what = f"round {plan.round_id}" if plan is not None else "final update"
    if answered.cached:
        return f"{what}: resent the cached reply (a retried update; not trained again)"
    cross = sum(t.source_id != participant_id for t in update.pool)
    metrics = sub.report.metrics if sub is not None and sub.report is not None else {}
    parts = []
    if update.pool:
        parts.append(f"trained on {len(update.pool)} pooled samples of round {update.pool_round} ({cross} from other "
                     f"labs) in {metrics.get('time_training_s', 0.0):.1f}s")
        if "own_verified_reward_mean" in metrics:  # the coordinator holds the answers: its verdicts, one round late
            parts.append(f"verified reward of round {update.pool_round} {metrics['own_verified_reward_mean']:.2f}")
    if sub is not None and sub.report is not None and sub.report.eval_accuracy is not None:
        parts.append(f"eval accuracy {sub.report.eval_accuracy:.3f} ({metrics.get('time_eval_s', 0.0):.1f}s)")
    if sub is not None and sub.trajectories:
        rewards = [t.reward for t in sub.trajectories]
        cut = metrics.get("rollout_truncated_frac", 0.0)  # cut at the plan's max_new_tokens (or the context)
        claimed = "no claims (the coordinator holds the answers)" if plan is not None and \
            plan.answer_keys == "coordinator" else f"claimed reward {sum(rewards) / len(rewards):.2f}"
        parts.append(f"rolled out {len(rewards)} in {metrics.get('time_rollout_s', 0.0):.1f}s, {claimed}"
                     + (f", {cut:.0%} cut at the response budget" if cut else ""))
    return f"{what}: " + "; ".join(parts or ["nothing to do"]) + f" [{answered.seconds:.1f}s]"


class LogWatcher:
    """Prints the SuperNode log's reconnect lines on the client's console as they appear."""

    def __init__(self, path: Path, out=say) -> None:  # noqa: ANN001 - a print-like callable
        self.path, self.out = path, out
        self.offset = path.stat().st_size if path.exists() else 0
        self.hacfed_backoff = False  # hacfed's own lines seen: flwr's duplicates are not printed
        self.cut_off = False  # the SuperLink answered "Invalid node ID": this lab's key was unregistered

    def pump(self) -> None:
        if not self.path.exists():
            return
        size = self.path.stat().st_size
        if size < self.offset:  # a new log file
            self.offset = 0
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            data = fh.read()
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        for line in complete.decode("utf-8", errors="replace").splitlines():
            if "Invalid node ID" in line:  # Flower's SuperNode then only retries forever
                self.cut_off = True
            if RECONNECT_MARK in line:
                self.hacfed_backoff = True
                self.out(line[line.index(RECONNECT_MARK) + len(RECONNECT_MARK):].strip())
            elif _STOCK_RETRY in line and not self.hacfed_backoff:  # a stock flower-supernode
                self.out("the coordinator is unreachable; " + line[line.index(_STOCK_RETRY):].strip())


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def connect_failure(log_tail: str, state_dir: Path) -> tuple[str, float]:
    """Why the SuperNode could not join, in one line, and how long to wait before trying again."""
    if "No SuperNode found with the given public key" in log_tail:
        return (f"the coordinator refused this lab's SuperNode key: it is not registered (or was revoked). Send "
                f"the enrolment line in {state_dir / ENROLMENT_FILE} to the coordinator's operator", 30.0)
    if "could not be activated" in log_tail:
        return ("the coordinator still counts this lab's previous SuperNode as online (it stopped without "
                "signing off; Flower forgets it within about a minute)", 10.0)
    if "handshake" in log_tail.lower() or "SSL" in log_tail:
        return ("the TLS handshake with the coordinator failed: check --tls-ca (the federation's ca.pem) and that "
                "--server is a name or address its certificate names", 30.0)
    lines = [_ANSI.sub("", line) for line in log_tail.splitlines() if line.strip()]  # Flower's colours: plain
    return ("the SuperNode exited while connecting: " + (lines[-1][-300:] if lines else "no output"), 5.0)


class Client:
    def __init__(self, cfg: ClientConfig, metrics: MetricsLogger | None = None) -> None:
        self.cfg = cfg
        self.metrics = metrics  # the lab's own rows: STATE/metrics.jsonl, --tensorboard, --wandb
        self._metrics_failed = False
        self.final_offset: int | None = None  # SuperNode log size when the final answer was handed over
        self.final_answered = threading.Event()
        self.node: SuperNode | None = None
        self.log = LogWatcher(cfg.state_dir / "supernode" / "supernode.log")
        self.run_id: str | None = None
        self.final_accuracy: float | None = None  # held-out accuracy after training on the final pool
        self.truncation = TruncationWarnings(BUDGET_SETTING)  # responses cut at the budget, as hacfed sim says
        self.refused: str | None = None  # why the coordinator will not take this lab as it is (exit 2)

    def on_answer(self, answered: Answered) -> None:
        say(describe_answer(answered, self.cfg.participant_id))
        self.run_id = answered.update.run_id
        report = answered.submission.report if answered.submission is not None else None
        if answered.final and report is not None and report.eval_accuracy is not None:
            self.final_accuracy = report.eval_accuracy
        if report is not None and not answered.cached:
            self.log_step(answered.update.hacpo.mode, report, answered.final)
            if warning := self.truncation.check(self.cfg.participant_id, report.metrics.get("rollout_truncated_frac")):
                say(warning)

    def log_step(self, mode: str, report, final: bool) -> None:  # noqa: ANN001 - a hacfed.messages.StepReport
        """The step's row to the lab's sinks; a sink that fails is said once and never stops the lab."""
        if self.metrics is None or self._metrics_failed:
            return
        try:
            self.metrics.write(step_row(self.cfg.participant_id, report.round_id, mode, self.cfg.participant.seed,
                                        dict(report.metrics), report.eval_accuracy, final))
        except Exception as exc:  # noqa: BLE001 - visibility must not cost the federation a round
            self._metrics_failed = True
            say(f"could not write this lab's metrics ({type(exc).__name__}: {exc}); not logging them any more")

    def on_finished(self) -> None:
        """The coordinator's final acknowledgement: the run is over for this lab (its final report
        is recorded, or it was quarantined)."""
        if self.final_answered.is_set():
            return  # a resent acknowledgement
        log = self.cfg.state_dir / "supernode" / "supernode.log"
        self.final_offset = log.stat().st_size if log.exists() else 0
        self.final_answered.set()

    def on_refused(self, line: str) -> None:
        """The coordinator will not take this lab as it is (`ParticipantService` `on_refused`): the
        supervising loop stops with exit code 2 once the answer in hand has left."""
        if self.refused is None:
            log = self.cfg.state_dir / "supernode" / "supernode.log"
            self.final_offset = log.stat().st_size if log.exists() else 0
            self.refused = line

    def closing_line(self) -> str:
        run = f"run {self.run_id}" if self.run_id else "the run"
        accuracy = "" if self.final_accuracy is None else f"; final held-out accuracy {self.final_accuracy:.3f}"
        return f"the federation is done: the coordinator closed {run} for {self.cfg.participant_id}{accuracy}"

    def start_node(self, sup: ProcessSupervisor, relay_address: str) -> SuperNode:
        """Start the SuperNode; while the coordinator is unreachable or refuses this lab, keep trying
        (and say why, once per reason)."""
        cfg = self.cfg
        node_config = {"participant-id": cfg.participant_id, "participant-address": relay_address}
        auth_key = None if cfg.insecure else cfg.state_dir / SUPERNODE_KEY
        told, transport = None, TransportWatch(cfg.server, cfg.insecure, say)  # a mismatch: said within seconds
        while True:
            try:
                with transport.watching():
                    self.node = start_supernode(sup, cfg.state_dir / "supernode", superlink_address=cfg.server,
                                                node_config=node_config, insecure=cfg.insecure, root_cert=cfg.tls_ca,
                                                auth_key=auth_key, idle_poll_s=cfg.idle_poll_s, ready_timeout_s=60.0)
                record_children(cfg.state_dir, [("supernode", self.node.process.pid)])
                return self.node
            except TimeoutError:
                say(f"the coordinator at {cfg.server} is not reachable yet; still trying")
            except ProcessError as exc:
                reason, wait_s = connect_failure(str(exc), cfg.state_dir)
                if transport.check_now() is not None:
                    told = reason  # the mismatch line says more than the generic handshake failure
                if reason != told:
                    say(f"{reason}; retrying every {wait_s:.0f}s")
                    told = reason
                time.sleep(wait_s)

    def reply_left(self, timeout_s: float = 120.0) -> bool:
        """True once the SuperNode logged sending (or failing to send) the answer to the final
        acknowledgement, so stopping it loses nothing."""
        log = self.cfg.state_dir / "supernode" / "supernode.log"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if log.exists():
                with open(log, "rb") as fh:
                    fh.seek(self.final_offset or 0)
                    if _SENT.search(fh.read().decode("utf-8", errors="replace")):
                        return True
            time.sleep(0.2)
        return False

    def leave_after_refusal(self, sleep: Callable[[float], None] = time.sleep) -> None:
        """Once the answer in hand has left (a task mismatch: the coordinator learns it too and stops
        waiting for this lab), keep the SuperNode up REFUSAL_LINGER_S more so the coordinator can pull it."""
        if self.reply_left(timeout_s=30.0):
            sleep(REFUSAL_LINGER_S)

    def watch_log(self) -> threading.Event:
        """Print the SuperNode's reconnect lines from now on (also while it is still connecting)."""
        stop = threading.Event()

        def pump() -> None:
            while not stop.wait(0.2):
                self.log.pump()

        threading.Thread(target=pump, name="supernode-log", daemon=True).start()
        return stop

    def supervise(self, sup: ProcessSupervisor, relay_address: str) -> int:
        stop_watching = self.watch_log()
        try:
            return self._supervise(sup, relay_address)
        finally:
            stop_watching.set()

    def _supervise(self, sup: ProcessSupervisor, relay_address: str) -> int:
        node = self.start_node(sup, relay_address)
        say(f"connected to {self.cfg.server} as {self.cfg.participant_id} (SuperNode id {node.node_id}); waiting "
            f"for the coordinator (its receipts and refusals are printed here)")
        told = False
        while True:
            if self.refused is not None:
                say(f"{self.refused}. Stopping (exit code 2).")  # said at once; the SuperNode goes after
                self.leave_after_refusal()
                return 2
            if self.final_answered.is_set() and not told:
                told = True
                if self.cfg.stay:
                    say(f"{self.closing_line()}; --stay: still serving (Ctrl-C to stop)")
                else:
                    if not self.reply_left():
                        say("the SuperNode did not send the last answer within 120s; exiting anyway")
                    say(f"{self.closing_line()}; checkpoints in {self.cfg.state_dir}. Exiting.")
                    return 0
            if self.node is not None and not self.node.process.alive():
                if self.node.process.returncode() == HEARTBEAT_LOST_EXIT:  # alive, but dropped by the SuperLink
                    say(f"{heartbeat_lost_reason(self.node.process.log_path)}; restarting the SuperNode")
                else:
                    say(f"the SuperNode exited (code {self.node.process.returncode()}); restarting it")
                sup.stop(self.node.process)
                time.sleep(2.0)
                self.start_node(sup, relay_address)
            elif self.node is not None and self.log.cut_off:
                self.log.cut_off = False
                say("the coordinator no longer accepts this lab's SuperNode (its registration was revoked or "
                    "removed); reconnecting to find out")
                sup.stop(self.node.process)
                self.start_node(sup, relay_address)
            time.sleep(0.2)


def run_client(cfg: ClientConfig) -> int:
    from hacfed.clients.textfilter import filters_for
    from hacfed.tasks.registry import load_task

    task = load_task(cfg.task, base_dir=cfg.config_dir)  # a bad [task] fails before any file exists
    filters_for(cfg.participant, task)  # so does a deny-list that refuses the task's reference solutions
    coordinator_key = load_public_key(cfg.coordinator_key)
    state = cfg.state_dir
    state.mkdir(parents=True, exist_ok=True)
    lock = open(state / "client.lock", "w")  # noqa: SIM115 - held for the process's lifetime
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise ValueError(f"another hacfed-client is running with state dir {state}") from None
    for leftover in kill_leftovers(state):
        say(f"stopped {leftover} left running by a previous hacfed-client")
    Outbox(state / "service" / OUTBOX_FILE).close()  # a corrupt or read-only outbox fails here, before the model loads
    enrolment = ensure_lab_keys(state, cfg.participant_id)
    private_key = enrolment.private_key
    say(f"{'created' if enrolment.created else 'using'} this lab's keys in {state}: {enrolment.describe()}")
    say(f"enrolment for the coordinator's operator (hacfed-server register), also in {state / ENROLMENT_FILE}:")
    print(enrolment.line, flush=True)
    lab = cfg.participant
    say(f"loading model {lab.model} on {lab.device} ({lab.finetune} fine-tuning, {lab.rollout_backend} rollouts); "
        f"task {task.name}")
    from hacfed.clients.participant import Participant  # torch

    participant = Participant.from_spec(lab, task)
    if cfg.slowdown != 1.0:  # hacfed.clients.slowdown: a slower lab, for testing bounded staleness
        from hacfed.clients.slowdown import SlowedParticipant

        participant = SlowedParticipant(participant, cfg.slowdown)
        say(f"slowdown {cfg.slowdown:g}: every step waits {cfg.slowdown - 1:g} x its rollout and training time")
    if participant.last_round is not None:
        say(f"resumed from checkpoint: last plan rolled out was round {participant.last_round} "
            f"(policy version {participant.policy_version})")
    metrics = open_logger(jsonl=state / METRICS_FILE, tensorboard_dir=cfg.tensorboard, wandb_project=cfg.wandb,
                          run_name=cfg.participant_id)
    if cfg.tensorboard is not None:
        say(f"TensorBoard event files in {cfg.tensorboard} (tensorboard --logdir {cfg.tensorboard})")
    client = Client(cfg, metrics)
    service = ParticipantService(participant, task, private_key, coordinator_key, state / "service",
                                 on_answer=client.on_answer, on_finished=client.on_finished, on_notice=say,
                                 on_refused=client.on_refused)
    relay = relay_socket_place(state)
    if relay.note() is not None:
        say(relay.note())
    try:
        server = serve_participant_unix(service.handle, relay.path)
    except BaseException:
        relay.cleanup()
        raise
    say(f"participant service on {relay.address} (only this user can connect)")
    try:
        with ProcessSupervisor(grace_s=10.0) as sup:
            code = client.supervise(sup, relay.address)
        forget_children(state)
        return code
    except (KeyboardInterrupt, SystemExit) as stop:
        forget_children(state)
        say(f"stopped ({type(stop).__name__}); checkpoints kept in {state}: run the same command to resume")
        distributed = sys.modules.get("hacfed.clients.distributed")
        return 1 if getattr(distributed, "stopped_by", None) is not None else 0
    finally:
        server.stop(5.0).wait()
        relay.cleanup()
        metrics.close()
        lock.close()
