"""hacfed's Flower ServerApp: drives rounds through a pluggable `RoundDriver`.

Runs in the coordinator's ServerApp process, which the SuperLink started by hacfed-server starts
for the submitted run (`hacfed.server.superlink.submit_run`).

Why push/pull and not `grid.send_and_receive`: the latter sleeps 3 s between pulls; here
the loop polls every `poll_interval_s` (hacfed: `server.poll_interval_s`, 0.05 s by default) and
closes each round at its own deadline, so a round costs what the SuperNodes cost and no more.

The ServerApp knows nothing of the payload or of rounds: one loop runs every exchange on its own.
Each poll interval it asks the driver for the payloads of the nodes it wants to send something now
(`next_round`), sends them as `train.exchange` messages, hands every reply (or error) that came back
to the driver, gives an exchange unanswered after `round_timeout_s` an error, and lets the driver
close what may close (`close_round`). Whether labs are in lockstep (hacfed's synchronous rounds,
max_staleness K = 0) or each at its own step (K >= 1, round_join "newest") is the driver's business:
it sends a lab nothing while that lab's exchange is out, and decides itself when a round is over.
Participants are discovered continuously: every node that appears in
`grid.get_node_ids()` gets a `query.hello` carrying the driver's challenge; the reply names a
participant id (from the SuperNode's node config; a ServerApp cannot read node configs itself)
and carries the participant's proof, and the node becomes that participant only if the driver's
`identify` accepts it (hacfed: `hacfed.hello`, `hacfed.server.membership`). A refused node is
asked again at once, the first time (that hello may tell it why: hacfed's notice that its id is not
registered, `hacfed.server.hellos`, on which its hacfed-client stops), then after `hello_timeout_s`.
A node that joins late is sent whatever the driver sends it at the next poll.

The run config names the driver: `driver` = "pkg.module:factory", `factory(run_config) ->
RoundDriver` (the other keys, declared in `server/flower_app/pyproject.toml`, are the driver's).
The loop's intervals are the driver's `timing`, taken from the driver's own validated config
(hacfed: the `ServerConfig` hacfed-server wrote), so no setting is read or checked twice.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from logging import INFO, WARNING
from typing import Protocol, runtime_checkable

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.common.constant import ErrorCode
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from hacfed.flower_protocol import ERROR_KEY, PARTICIPANT_ID_KEY, PAYLOAD_KEY, RECORD_NAME, TORCH_LOADED_KEY
from hacfed.identity import printable

HELLO_TYPE = "query.hello"
EXCHANGE_TYPE = "train.exchange"
_ERROR_CODE_NAMES = {v: k for k, v in vars(ErrorCode).items() if isinstance(v, int)}


@runtime_checkable
class RoundDriver(Protocol):
    """What the coordinator implements; the ServerApp calls it from one thread."""

    def next_round(self, participants: Mapping[int, str]) -> Mapping[int, bytes] | None:
        """Payloads to send now by node id (a subset of `participants`, node id -> participant id,
        none of whose exchange is still out), or None (or {}) to send nothing this poll."""

    def on_replies(self, replies: Sequence[tuple[int, bytes]]) -> None:
        """The (node id, reply bytes) of one pull, in the order pulled; each ends that node's exchange."""

    def on_error(self, node_id: int, error: str) -> None:
        """A node's exchange failed or ran out, as "HACFED-E-...: message"; it ends that exchange."""

    def close_round(self) -> None:
        """Called after every poll: close whatever may close now (quorum, deadline), else nothing."""

    def finished(self) -> bool:
        """True when the run is over; the ServerApp then returns."""

    def hello(self, node_id: int) -> bytes:
        """The payload of a hello to a newly seen node (e.g. a signed challenge)."""

    def identify(self, node_id: int, participant_id: str, proof: bytes) -> bool:
        """True when the node, which answered the hello as `participant_id` with `proof`, may take
        part as that participant; False leaves the node out (it is asked again later)."""

    @property
    def timing(self) -> LoopTiming:
        """The loop's intervals, from the driver's config."""


@dataclass(frozen=True)
class LoopTiming:
    """The round loop's intervals in seconds. Not checked here: a driver derives them from its
    config, validated where it was loaded (hacfed: `ServerConfig`).

    poll_interval_s: how often the loop asks the driver and pulls replies; round_timeout_s: how long
    an exchange may stay unanswered before it gets an error, also the TTL of its messages;
    hello_timeout_s: how long a hello may stay unanswered before it is sent again;
    discovery_interval_s: how often to look for new nodes."""

    poll_interval_s: float
    round_timeout_s: float
    hello_timeout_s: float = 60.0
    discovery_interval_s: float = 1.0


def driver_spec(run_config: Mapping[str, object]) -> str:
    """The run config's `driver`, "package.module:factory"."""
    spec = run_config.get("driver")
    if not isinstance(spec, str) or ":" not in spec or spec.startswith(":") or spec.endswith(":"):
        raise ValueError(f"run config 'driver' must be 'package.module:factory', got {spec!r}")
    return spec


def load_driver(spec: str, run_config: Mapping[str, object]) -> RoundDriver:
    """Import `module:factory` and build the driver with the run config."""
    module_name, _, attr = spec.partition(":")
    factory = getattr(importlib.import_module(module_name), attr, None)
    if not callable(factory):
        raise ValueError(f"driver {spec!r}: {attr!r} is not a callable in {module_name}")
    driver = factory(run_config)
    missing = [m for m in ("next_round", "on_replies", "on_error", "close_round", "finished", "hello",
                           "identify") if not callable(getattr(driver, m, None))]
    if not isinstance(getattr(driver, "timing", None), LoopTiming):
        missing.append("timing (a LoopTiming)")
    if missing:
        raise ValueError(f"driver {spec!r} built a {type(driver).__name__} without {', '.join(missing)}")
    return driver


def describe_flower_error(msg: Message) -> str:
    """A Flower-level error reply (node gone, ClientApp crashed, TTL expired) as one line."""
    code = msg.error.code
    return f"HACFED-E-FLOWER-{_ERROR_CODE_NAMES.get(code, 'UNKNOWN')}: code {code}: {msg.error.reason}"


@dataclass(frozen=True)
class RelayReply:
    """A relay's reply: exactly one of payload / error, plus what the relay reported."""

    payload: bytes | None
    error: str | None
    participant_id: str | None = None
    torch_loaded: bool | None = None

    def __post_init__(self) -> None:
        if (self.payload is None) == (self.error is None):
            raise ValueError(f"a reply has a payload or an error, got {self!r}")


def parse_reply(msg: Message) -> RelayReply:
    """Read a relay reply; Flower errors and malformed replies become `error` strings."""
    if msg.has_error():
        return RelayReply(None, describe_flower_error(msg))
    record = msg.content.config_records.get(RECORD_NAME)
    if record is None:
        return RelayReply(None, f"HACFED-E-REPLY-MALFORMED: reply has no {RECORD_NAME!r} config record")
    participant = record.get(PARTICIPANT_ID_KEY)
    participant_id = participant if isinstance(participant, str) else None
    torch = record.get(TORCH_LOADED_KEY)
    torch_loaded = torch if isinstance(torch, bool) else None
    error = record.get(ERROR_KEY)
    payload = record.get(PAYLOAD_KEY)
    if isinstance(error, str):
        return RelayReply(None, error, participant_id, torch_loaded)
    if isinstance(payload, bytes):
        return RelayReply(payload, None, participant_id, torch_loaded)
    if msg.metadata.message_type == HELLO_TYPE:
        return RelayReply(b"", None, participant_id, torch_loaded)
    return RelayReply(None, "HACFED-E-REPLY-MALFORMED: reply has neither payload nor error",
                      participant_id, torch_loaded)


def _message(node_id: int, message_type: str, payload: bytes | None, group_id: str, ttl: float) -> Message:
    values: dict[str, bytes] = {} if payload is None else {PAYLOAD_KEY: payload}
    content = RecordDict({RECORD_NAME: ConfigRecord(values)})
    return Message(content, node_id, message_type, ttl=ttl, group_id=group_id)


class RoundLoop:
    """Discovery plus every exchange on its own over a Grid; see the module docstring."""

    def __init__(self, grid: Grid, driver: RoundDriver, timing: LoopTiming) -> None:
        self.grid = grid
        self.driver = driver
        self.timing = timing
        self.participants: dict[int, str] = {}  # node id -> participant id (answered hello)
        self._hellos: dict[str, tuple[int, float]] = {}  # message id -> (node id, sent at)
        self._hello_retry_at: dict[int, float] = {}  # node id -> when to say hello again
        self._refused: set[int] = set()  # nodes refused once: their next hellos wait hello_timeout_s
        self._next_discovery = 0.0
        self._outstanding: dict[str, int] = {}  # message id -> node id of the exchanges out
        self._expires: dict[str, float] = {}  # message id -> when its exchange gets an error
        self.sends = 0  # pushes of one or more exchanges

    def run(self) -> None:
        while not self.driver.finished():
            self.poll()

    def poll(self) -> None:
        """One turn: discovery, the driver's payloads out, a pull, the exchanges run out, a close."""
        self.discover()
        payloads = self.driver.next_round(dict(self.participants))
        if payloads:
            self.send(payloads)
        # Let this poll's deliveries go before the next are built: at 64 labs a round's are ~380 MB,
        # and holding them through next_round doubled the peak (bench/coordinator_scale.py).
        payloads = None
        time.sleep(self.timing.poll_interval_s)
        if self._outstanding:
            self._pull()
        now = time.monotonic()
        timeout = self.timing.round_timeout_s
        for msg_id in [m for m, at in self._expires.items() if at <= now]:
            del self._expires[msg_id]
            node_id = self._outstanding.pop(msg_id)
            self.driver.on_error(node_id, f"HACFED-E-ROUND-DEADLINE: no reply within {timeout:g}s")
        self.driver.close_round()

    def send(self, payloads: Mapping[int, bytes]) -> None:
        """One exchange per node, in place of any still out to it; the driver gets an error for each
        the SuperLink refused."""
        unknown = set(payloads) - set(self.participants)
        if unknown:
            raise ValueError(f"driver returned payloads for unknown node ids {sorted(unknown)}")
        for msg_id in [m for m, node in self._outstanding.items() if node in payloads]:
            # Superseded: the driver let that exchange go (its round closed) and sends the node anew. Its
            # reply, should it still come, is never pulled, so it cannot pass for the new exchange's.
            del self._outstanding[msg_id], self._expires[msg_id]
        self.sends += 1
        node_ids = list(payloads)
        timeout = self.timing.round_timeout_s
        messages = [_message(n, EXCHANGE_TYPE, payloads[n], str(self.sends), timeout) for n in node_ids]
        expires = time.monotonic() + timeout
        for node_id, msg_id in zip(node_ids, self.grid.push_messages(messages), strict=True):
            if msg_id:
                self._outstanding[msg_id] = node_id
                self._expires[msg_id] = expires
            else:
                self.driver.on_error(node_id, "HACFED-E-PUSH-FAILED: the SuperLink refused the message")

    def discover(self) -> None:
        """Say hello to new nodes, collect hello replies, forget nodes that left."""
        now = time.monotonic()
        if self._hellos:
            self._collect_hellos(now)
        if now < self._next_discovery:
            return
        self._next_discovery = now + self.timing.discovery_interval_s
        online = set(self.grid.get_node_ids())
        for node_id in [n for n in self.participants if n not in online]:
            log(INFO, "[hacfed] node %s (%s) left", node_id, self.participants.pop(node_id))
        waiting = {node_id for node_id, _ in self._hellos.values()}
        new = [n for n in online - set(self.participants) - waiting if self._hello_retry_at.get(n, 0.0) <= now]
        if new:
            ttl = self.timing.hello_timeout_s
            messages = [_message(n, HELLO_TYPE, self.driver.hello(n), "hello", ttl) for n in new]
            for node_id, msg_id in zip(new, self.grid.push_messages(messages), strict=True):
                if msg_id:
                    self._hellos[msg_id] = (node_id, now)

    def _collect_hellos(self, now: float) -> None:
        for reply in self.grid.pull_messages(list(self._hellos)):
            entry = self._hellos.pop(reply.metadata.reply_to_message_id, None)
            if entry is None:
                continue  # a reply the SuperLink sent twice; the first one counted
            node_id = entry[0]
            hello = parse_reply(reply)
            participant_id = hello.participant_id
            if hello.error is not None or participant_id is None or hello.payload is None:
                log(WARNING, "[hacfed] hello to node %s failed: %s", node_id, printable(hello.error, 300))
                self._hello_retry_at[node_id] = now + self.timing.hello_timeout_s
                continue
            if not self.driver.identify(node_id, participant_id, hello.payload):
                log(WARNING, "[hacfed] node %s refused as participant %s", node_id, printable(participant_id))
                again_at_once = node_id not in self._refused  # the first time: the next hello may say why
                self._refused.add(node_id)
                self._hello_retry_at[node_id] = now if again_at_once else now + self.timing.hello_timeout_s
                continue
            self._refused.discard(node_id)
            for other, pid in list(self.participants.items()):
                if pid == participant_id and other != node_id:
                    log(WARNING, "[hacfed] %s moved from node %s to node %s", pid, other, node_id)
                    del self.participants[other]
            self.participants[node_id] = participant_id
            log(INFO, "[hacfed] node %s is participant %s", node_id, participant_id)
        for msg_id, (node_id, sent_at) in list(self._hellos.items()):
            if now - sent_at > self.timing.hello_timeout_s:
                del self._hellos[msg_id]  # expired; a new hello goes out at the next discovery

    def _pull(self) -> None:
        """Hand the driver the replies (together: it overlaps their judging) and errors that came back
        for the exchanges out, each taken out of them."""
        replied: list[tuple[int, bytes]] = []
        for reply in self.grid.pull_messages(list(self._outstanding)):
            msg_id = reply.metadata.reply_to_message_id
            node_id = self._outstanding.pop(msg_id, None)
            if node_id is None:
                log(WARNING, "[hacfed] ignoring a reply to unknown message %s", msg_id)
                continue
            self._expires.pop(msg_id, None)
            relayed = parse_reply(reply)
            log(INFO, "[hacfed] exchange %s: node %s (%s) %s; relay torch loaded: %s", msg_id, node_id,
                printable(relayed.participant_id), f"replied {len(relayed.payload)} bytes"
                if relayed.payload is not None else f"failed: {relayed.error}", relayed.torch_loaded)
            if relayed.payload is not None:
                replied.append((node_id, relayed.payload))
            else:
                self.driver.on_error(node_id, str(relayed.error))
        if replied:
            self.driver.on_replies(replied)


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    spec = driver_spec(context.run_config)
    driver = load_driver(spec, context.run_config)
    timing = driver.timing
    log(INFO, "[hacfed] ServerApp: driver %s, poll %.2fs, round deadline %.0fs",
        spec, timing.poll_interval_s, timing.round_timeout_s)
    loop = RoundLoop(grid, driver, timing)
    loop.run()
    log(INFO, "[hacfed] ServerApp finished after %d sends", loop.sends)
