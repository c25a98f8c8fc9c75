"""Shared doubles and helpers of the Flower transport tests (test_flower_transport*.py); not collected.

The round-loop doubles (`FakeGrid`, `echo_node`, `RecordingDriver`) stand in for Flower's Grid and
for hacfed's driver; the rest serves the real deployments: echo participants in the test's process
and `EchoDriver`, which the SuperLink's ServerApp imports from this module (PYTHONPATH = repo root),
so module-level code here must stay import-safe and torch-free.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import psutil
from flwr.app import ConfigRecord, Error, Message, RecordDict

from hacfed.clients.relay import hello_content, serve_participant
from hacfed.server.serverapp import HELLO_TYPE, LoopTiming

REPO_ROOT = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- round loop


class FakeGrid:
    """An in-memory Grid: `respond(node_id, message)` returns the reply or None (silence)."""

    def __init__(self, respond: Callable[[int, Message], Message | None]) -> None:
        self.respond = respond
        self.nodes: list[int] = []
        self.sent: list[Message] = []
        self._replies: dict[str, Message] = {}
        self._count = 0

    def get_node_ids(self) -> list[int]:
        return list(self.nodes)

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        ids = []
        for msg in messages:
            self._count += 1
            msg.metadata.__dict__["_message_id"] = f"m{self._count}"  # as flwr's GrpcGrid does
            self.sent.append(msg)
            reply = self.respond(msg.metadata.dst_node_id, msg)
            if reply is not None:
                self._replies[msg.metadata.message_id] = reply
            ids.append(msg.metadata.message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        return [self._replies.pop(i) for i in list(message_ids) if i in self._replies]


def echo_node(participant_id: str | None, *, silent: bool = False, flower_error: bool = False):
    def respond(msg: Message) -> Message | None:
        if msg.metadata.message_type == HELLO_TYPE:
            if participant_id is None:  # a SuperNode without a participant-id in its node config
                return Message(hello_content(msg.content, {}, {}), reply_to=msg)
            proof = f"proof:{participant_id}".encode()
            return Message(RecordDict({"hacfed": ConfigRecord({"participant-id": participant_id, "payload": proof})}),
                           reply_to=msg)
        if silent:
            return None
        if flower_error:
            return Message(Error(code=5, reason="node went away"), reply_to=msg)
        payload = msg.content["hacfed"]["payload"]
        return Message(RecordDict({"hacfed": ConfigRecord({"payload": payload.upper()})}), reply_to=msg)

    return respond


class RecordingDriver:
    """Runs `rounds` rounds once `quorum` participants are known; records what happens."""

    def __init__(self, rounds: int, quorum: int) -> None:
        self.rounds, self.quorum = rounds, quorum
        self.round = 0
        self.open = False
        self.waiting: set[int] = set()  # nodes whose exchange of the open round has not ended
        self.log: list[tuple[int, str, int, object]] = []
        self.on_next_round: Callable[[int], None] = lambda r: None

    def next_round(self, participants: Mapping[int, str]) -> Mapping[int, bytes] | None:
        if self.open or self.round >= self.rounds or len(participants) < self.quorum:
            return None
        self.round += 1
        self.open, self.waiting = True, set(participants)
        self.on_next_round(self.round)
        return {n: f"r{self.round}-{p}".encode() for n, p in participants.items()}

    def on_replies(self, replies) -> None:
        for node_id, payload in replies:
            self.log.append((self.round, "reply", node_id, payload))
            self.waiting.discard(node_id)

    def on_error(self, node_id: int, error: str) -> None:
        self.log.append((self.round, "error", node_id, error.split(":")[0]))
        self.waiting.discard(node_id)

    def close_round(self) -> None:
        """The round closes once every exchange of it ended (a reply, an error or its deadline)."""
        self.open = self.open and bool(self.waiting)

    def finished(self) -> bool:
        return self.round >= self.rounds and not self.open

    def hello(self, node_id: int) -> bytes:
        return b"challenge"

    def identify(self, node_id: int, participant_id: str, proof: bytes) -> bool:
        self.log.append((self.round, "hello", node_id, participant_id))
        return proof == f"proof:{participant_id}".encode() and participant_id != "impostor"


def loop_timing(**overrides: float) -> LoopTiming:
    values = {"poll_interval_s": 0.01, "round_timeout_s": 0.3, "hello_timeout_s": 5.0, "discovery_interval_s": 0.01}
    values.update(overrides)
    return LoopTiming(**values)


# ----------------------------------------------------------------------------- real Flower


def echo_reply(name: str, request: bytes) -> bytes:
    """The echo participants' transformation, checked by `EchoDriver`."""
    return name.encode() + b":" + request[::-1]


class EchoDriver:
    """The ServerApp driver of the slow tests: `rounds` rounds once `participants` are known.

    Runs inside `flwr-serverapp` (started by the SuperLink). Round 2 pads each payload to
    `pad` bytes (above gRPC's 4 MiB default) to prove the size limits are raised end to end.
    Writes one JSON line per round to `<state-dir>/rounds.jsonl` for the test to read.
    """

    def __init__(self, run_config: Mapping[str, object]) -> None:
        settings = json.loads(str(run_config["driver-config"]))
        self.rounds, self.expected, self.pad = settings["rounds"], settings["participants"], settings["pad"]
        self.hold_until = settings.get("hold_until")  # a file: the run ends only once the test created it
        self.out = Path(str(run_config["state-dir"])) / "rounds.jsonl"
        self.timing = LoopTiming(poll_interval_s=0.2, round_timeout_s=120.0)
        self.round = 0
        self.open = False
        self.waiting: set[int] = set()  # nodes whose exchange of the open round has not ended
        self.names: dict[int, str] = {}
        self.sent: dict[int, bytes] = {}
        self.results: dict[str, dict[str, object]] = {}
        self.started = 0.0

    def next_round(self, participants: Mapping[int, str]) -> Mapping[int, bytes] | None:
        if self.open or len(participants) < self.expected or self.round >= self.rounds:
            return None
        self.round += 1
        self.open, self.names, self.results, self.waiting = True, dict(participants), {}, set(participants)
        self.started = time.monotonic()
        pad = self.pad if self.round == 2 else 0
        self.sent = {node: f"round-{self.round}-{name}|".encode().ljust(pad, b".")
                     for node, name in participants.items()}
        return self.sent

    def _record(self, node_id: int, **result: object) -> None:
        result["seconds"] = round(time.monotonic() - self.started, 3)
        self.results[self.names[node_id]] = result
        self.waiting.discard(node_id)

    def on_replies(self, replies) -> None:
        for node_id, payload in replies:
            expected = echo_reply(self.names[node_id], self.sent[node_id])
            self._record(node_id, ok=payload == expected, bytes=len(payload), head=payload[:40].decode())

    def on_error(self, node_id: int, error: str) -> None:
        self._record(node_id, error=error)

    def close_round(self) -> None:
        if not self.open or self.waiting:  # closes once every exchange of the round ended
            return
        line = {"round": self.round, "results": self.results, "seconds": round(time.monotonic() - self.started, 3)}
        with open(self.out, "a", encoding="utf-8") as file:
            file.write(json.dumps(line) + "\n")
        self.open = False

    def finished(self) -> bool:
        held = self.hold_until is not None and not Path(self.hold_until).exists()
        return self.round >= self.rounds and not self.open and not held

    def hello(self, node_id: int) -> bytes:
        return b"hello"

    def identify(self, node_id: int, participant_id: str, proof: bytes) -> bool:
        return proof == echo_reply(participant_id, b"hello")  # the echo participant answered


def make_echo_driver(run_config: Mapping[str, object]) -> EchoDriver:
    return EchoDriver(run_config)


def running_descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE}


@contextmanager
def echo_participants(names: Iterable[str]) -> Iterator[tuple[dict[str, int], dict[str, list[int]]]]:
    """Echo participant services in this process: name -> port, and name -> request sizes."""
    sizes: dict[str, list[int]] = {}
    servers = {}
    for name in names:
        sizes[name] = []
        def handle(request: bytes, name: str = name) -> bytes:
            sizes[name].append(len(request))
            return echo_reply(name, request)
        servers[name] = serve_participant(handle)
    try:
        yield {name: port for name, (_, port) in servers.items()}, sizes
    finally:
        for server, _ in servers.values():
            server.stop(0).wait()


def run_config(state_dir: Path, *, driver: str = "make_echo_driver", **settings: object) -> dict[str, object]:
    state_dir.mkdir(parents=True, exist_ok=True)
    return {
        "driver": f"tests.integration.flower_transport_helpers:{driver}",
        "driver-config": json.dumps(settings),
        "state-dir": str(state_dir),
        "relay-timeout-s": 100.0,
    }


def read_rounds(state_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (state_dir / "rounds.jsonl").read_text().splitlines()]


def write_tls_files(directory: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1 / localhost: (ca, cert, key)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hacfed test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                        x509.DNSName("localhost")]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    directory.mkdir(parents=True, exist_ok=True)
    paths = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths

