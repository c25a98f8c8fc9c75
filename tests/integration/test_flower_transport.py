"""Flower transport: the bytes relay, the ServerApp round loop, and a real deployment.

Fast tests use loopback gRPC and an in-memory Grid; the `slow` test starts a real
SuperLink, three SuperNodes and `flwr run`, with echo participants served from this process.
The SuperLink's ServerApp imports `EchoDriver` from this module (PYTHONPATH = repo root),
so module-level code here must stay import-safe and torch-free.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import grpc
import psutil
import pytest
from flwr.app import ConfigRecord, Error, Message, RecordDict

from hacfed.clients.relay import (
    ParticipantRejection,
    RelayError,
    call_participant,
    hello_content,
    relay_content,
    serve_participant,
)
from hacfed.server.serverapp import EXCHANGE_TYPE, HELLO_TYPE, LoopTiming, RoundLoop

REPO_ROOT = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- relay


@pytest.fixture
def participant() -> Iterable[tuple[int, list[bytes]]]:
    """An echo participant on loopback: b"abc" -> b"echo:cba"; "fail:*" payloads raise."""
    seen: list[bytes] = []

    def handle(request: bytes) -> bytes:
        seen.append(request)
        if request == b"fail:value":
            raise ValueError("payload is not an envelope")
        if request == b"fail:crash":
            raise RuntimeError("model exploded")
        if request == b"fail:reject":
            raise ParticipantRejection(grpc.StatusCode.FAILED_PRECONDITION, "HACFED-E-STALE-ROUND", "round 3 is closed")
        if request == b"fail:slow":
            time.sleep(1.0)
        return b"echo:" + request[::-1]

    server, port = serve_participant(handle)
    try:
        yield port, seen
    finally:
        server.stop(0).wait()


def _relay(port: int, content: RecordDict, **run_config: object) -> ConfigRecord:
    node_config = {"participant-id": "lab-a", "participant-address": f"127.0.0.1:{port}"}
    reply = relay_content(content, node_config, {"relay-timeout-s": 5.0, **run_config})
    return reply["hacfed"]


def _payload(data: object) -> RecordDict:
    return RecordDict({"hacfed": ConfigRecord({"payload": data})})  # type: ignore[dict-item]


def test_relay_forwards_bytes_and_reply(participant: tuple[int, list[bytes]]) -> None:
    port, seen = participant
    record = _relay(port, _payload(b"\x00abc"))
    assert record["payload"] == b"echo:cba\x00"
    assert seen == [b"\x00abc"]
    assert record["participant-id"] == "lab-a"
    assert record["relay-torch-loaded"] == ("torch" in sys.modules)  # this process is the relay here
    assert "error" not in record


@pytest.mark.parametrize(
    ("request_bytes", "code", "status"),
    [
        (b"fail:value", "HACFED-E-INVALID-REQUEST", "INVALID_ARGUMENT"),
        (b"fail:crash", "HACFED-E-PARTICIPANT-FAILED", "INTERNAL"),
        (b"fail:reject", "HACFED-E-STALE-ROUND", "FAILED_PRECONDITION"),
    ],
)
def test_participant_failures_reach_the_relay_as_codes(
    participant: tuple[int, list[bytes]], request_bytes: bytes, code: str, status: str
) -> None:
    port, _ = participant
    with pytest.raises(RelayError) as info:
        call_participant(f"127.0.0.1:{port}", request_bytes, timeout_s=5.0)
    assert info.value.code == code
    assert f"status {status}" in info.value.message
    record = _relay(port, _payload(request_bytes))
    assert record["error"].startswith(f"{code}: ")
    assert "payload" not in record


def test_relay_timeout_and_unreachable_become_error_records(participant: tuple[int, list[bytes]]) -> None:
    port, _ = participant
    slow = _relay(port, _payload(b"fail:slow"), **{"relay-timeout-s": 0.2})
    assert slow["error"].startswith("HACFED-E-PARTICIPANT-TIMEOUT")
    server, closed_port = serve_participant(lambda b: b)
    server.stop(0).wait()
    gone = _relay(closed_port, _payload(b"x"))
    assert gone["error"].startswith("HACFED-E-PARTICIPANT-UNREACHABLE")


@pytest.mark.parametrize(
    ("content", "node_config", "run_config", "expected"),
    [
        (RecordDict(), None, None, "HACFED-E-RELAY-BAD-MESSAGE: message has no 'hacfed' record"),
        (_payload("text"), None, None, "HACFED-E-RELAY-BAD-MESSAGE: hacfed.payload is str, expected bytes"),
        (RecordDict({"hacfed": ConfigRecord({"other": b"x"})}), None, None, "HACFED-E-RELAY-BAD-MESSAGE"),
        (_payload(b"x"), {"participant-id": "a"}, None, "HACFED-E-RELAY-CONFIG: node config needs"),
        (_payload(b"x"), {"participant-address": "10.1.2.3:5000"}, None, "HACFED-E-RELAY-CONFIG"),
        (_payload(b"x"), None, {}, "HACFED-E-RELAY-CONFIG: run config needs a positive number"),
    ],
)
def test_bad_messages_and_configs_get_clear_error_records(
    content: RecordDict, node_config: dict | None, run_config: dict | None, expected: str
) -> None:
    node_config = node_config if node_config is not None else {"participant-address": "127.0.0.1:9"}
    run_config = run_config if run_config is not None else {"relay-timeout-s": 1.0}
    record = relay_content(content, node_config, run_config)["hacfed"]
    assert record["error"].startswith(expected)


def test_hello_names_the_participant_and_relays_its_answer(participant: tuple[int, list[bytes]]) -> None:
    port, seen = participant
    node_config = {"participant-id": "lab-b", "participant-address": f"127.0.0.1:{port}"}
    record = hello_content(_payload(b"challenge"), node_config, {"relay-timeout-s": 5.0})["hacfed"]
    assert record["participant-id"] == "lab-b" and record["payload"] == b"echo:egnellahc"
    assert seen == [b"challenge"]  # the participant itself answers the challenge (hacfed.hello)
    missing = hello_content(_payload(b"x"), {"participant-address": f"127.0.0.1:{port}"}, {"relay-timeout-s": 5.0})
    assert missing["hacfed"]["error"].startswith("HACFED-E-RELAY-CONFIG")


def test_participant_service_refuses_non_loopback_hosts() -> None:
    with pytest.raises(ValueError, match="loopback"):
        serve_participant(lambda b: b, host="0.0.0.0")


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


def _echo_node(participant_id: str | None, *, silent: bool = False, flower_error: bool = False):
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
        self.log: list[tuple[int, str, int, object]] = []
        self.on_next_round: Callable[[int], None] = lambda r: None

    def next_round(self, participants: Mapping[int, str]) -> Mapping[int, bytes] | None:
        if len(participants) < self.quorum:
            return None
        self.round += 1
        self.open = True
        self.on_next_round(self.round)
        return {n: f"r{self.round}-{p}".encode() for n, p in participants.items()}

    def on_replies(self, replies) -> None:
        for node_id, payload in replies:
            self.log.append((self.round, "reply", node_id, payload))

    def on_error(self, node_id: int, error: str) -> None:
        self.log.append((self.round, "error", node_id, error.split(":")[0]))

    def round_done(self) -> bool:
        return False

    def close_round(self) -> None:
        self.open = False

    def finished(self) -> bool:
        return self.round >= self.rounds and not self.open

    def hello(self, node_id: int) -> bytes:
        return b"challenge"

    def identify(self, node_id: int, participant_id: str, proof: bytes) -> bool:
        self.log.append((self.round, "hello", node_id, participant_id))
        return proof == f"proof:{participant_id}".encode() and participant_id != "impostor"


def _settings(**overrides: float) -> LoopTiming:
    values = {"poll_interval_s": 0.01, "round_timeout_s": 0.3, "hello_timeout_s": 5.0, "discovery_interval_s": 0.01}
    values.update(overrides)
    return LoopTiming(**values)


def test_round_loop_discovers_nodes_and_routes_replies_and_errors() -> None:
    nodes = {11: _echo_node("lab-a"), 12: _echo_node("lab-b", silent=True), 13: _echo_node("lab-c", flower_error=True)}
    grid = FakeGrid(lambda n, m: nodes[n](m))
    grid.nodes = [11, 12, 13]
    driver = RecordingDriver(rounds=2, quorum=3)
    loop = RoundLoop(grid, driver, _settings())  # type: ignore[arg-type]
    loop.run()
    assert loop.participants == {11: "lab-a", 12: "lab-b", 13: "lab-c"}
    for r in (1, 2):
        events = {(n, kind, value) for (rnd, kind, n, value) in driver.log if rnd == r}
        assert events == {
            (11, "reply", f"R{r}-LAB-A".encode()),
            (12, "error", "HACFED-E-ROUND-DEADLINE"),
            (13, "error", "HACFED-E-FLOWER-NODE_UNAVAILABLE"),
        }
    exchanges = [m for m in grid.sent if m.metadata.message_type == EXCHANGE_TYPE]
    assert sorted({m.metadata.group_id for m in exchanges}) == ["1", "2"]
    assert all(m.metadata.ttl == pytest.approx(0.3) for m in exchanges)


def test_late_node_joins_from_the_next_round_and_anonymous_nodes_are_left_out() -> None:
    nodes = {1: _echo_node("lab-a"), 2: _echo_node("lab-b"), 3: _echo_node(None)}
    grid = FakeGrid(lambda n, m: nodes[n](m))
    grid.nodes = [1, 3]
    driver = RecordingDriver(rounds=3, quorum=1)

    def node_joins(round_number: int) -> None:
        if round_number == 1:
            grid.nodes.append(2)

    driver.on_next_round = node_joins
    RoundLoop(grid, driver, _settings(round_timeout_s=1.0)).run()  # type: ignore[arg-type]
    by_round = {r: sorted(n for (rnd, kind, n, _) in driver.log if rnd == r and kind == "reply") for r in (1, 2, 3)}
    assert by_round[1] == [1]
    assert by_round[3] == [1, 2]
    assert all(n != 3 for (_, _, n, _) in driver.log)


def test_a_node_the_driver_does_not_identify_is_never_sent_a_round() -> None:
    nodes = {1: _echo_node("lab-a"), 2: _echo_node("impostor")}
    grid = FakeGrid(lambda n, m: nodes[n](m))
    grid.nodes = [1, 2]
    driver = RecordingDriver(rounds=20, quorum=1)
    loop = RoundLoop(grid, driver, _settings(hello_timeout_s=0.001))  # type: ignore[arg-type]
    loop.run()
    assert loop.participants == {1: "lab-a"}
    assert not [m for m in grid.sent if m.metadata.message_type == EXCHANGE_TYPE and m.metadata.dst_node_id == 2]
    hellos_to_2 = [m for m in grid.sent if m.metadata.message_type == HELLO_TYPE and m.metadata.dst_node_id == 2]
    assert len(hellos_to_2) >= 2  # asked again after hello_timeout_s (it may have been registered since)
    assert all(m.content["hacfed"]["payload"] == b"challenge" for m in hellos_to_2)  # the driver's hello payload


def test_driver_payload_for_unknown_node_is_a_bug_not_a_silent_skip() -> None:
    grid = FakeGrid(lambda n, m: _echo_node("lab-a")(m))
    grid.nodes = [1]
    loop = RoundLoop(grid, RecordingDriver(1, 1), _settings())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"unknown node ids \[99\]"):
        loop.run_round({99: b"x"})


# ----------------------------------------------------------------------------- real Flower


def test_fast_poll_shim_still_matches_this_flwr() -> None:
    """`start_supernode(idle_poll_s=...)` patches the 3 s sleep of flwr 1.32's SuperNode loop."""
    import inspect

    import flwr.supernode.start_client_internal as loop_module

    assert "time.sleep(3)" in inspect.getsource(loop_module.start_client_internal)
    assert loop_module.time is time


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
        self.names: dict[int, str] = {}
        self.sent: dict[int, bytes] = {}
        self.results: dict[str, dict[str, object]] = {}
        self.started = 0.0

    def next_round(self, participants: Mapping[int, str]) -> Mapping[int, bytes] | None:
        if len(participants) < self.expected or self.round >= self.rounds:
            return None
        self.round += 1
        self.open, self.names, self.results = True, dict(participants), {}
        self.started = time.monotonic()
        pad = self.pad if self.round == 2 else 0
        self.sent = {node: f"round-{self.round}-{name}|".encode().ljust(pad, b".")
                     for node, name in participants.items()}
        return self.sent

    def _record(self, node_id: int, **result: object) -> None:
        result["seconds"] = round(time.monotonic() - self.started, 3)
        self.results[self.names[node_id]] = result

    def on_replies(self, replies) -> None:
        for node_id, payload in replies:
            expected = echo_reply(self.names[node_id], self.sent[node_id])
            self._record(node_id, ok=payload == expected, bytes=len(payload), head=payload[:40].decode())

    def on_error(self, node_id: int, error: str) -> None:
        self._record(node_id, error=error)

    def round_done(self) -> bool:
        return False

    def close_round(self) -> None:
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


def _running_descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE}


@contextmanager
def _echo_participants(names: Iterable[str]) -> Iterator[tuple[dict[str, int], dict[str, list[int]]]]:
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


def _run_config(state_dir: Path, *, driver: str = "make_echo_driver", **settings: object) -> dict[str, object]:
    state_dir.mkdir(parents=True, exist_ok=True)
    return {
        "driver": f"tests.integration.test_flower_transport:{driver}",
        "driver-config": json.dumps(settings),
        "state-dir": str(state_dir),
        "relay-timeout-s": 100.0,
    }


def _rounds(state_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (state_dir / "rounds.jsonl").read_text().splitlines()]


HELLO_DOWN = r"hello to node \d+ failed: 'HACFED-E-PARTICIPANT-UNREACHABLE: 127\.0\.0\.1:1"


@pytest.mark.slow
def test_two_rounds_over_real_superlink_and_supernodes(tmp_path: Path) -> None:
    from hacfed.clients.supernode import start_supernode
    from hacfed.procs import ProcessSupervisor, flower_env
    from hacfed.server.superlink import start_superlink, submit_run, wait_for_run

    before = _running_descendants()
    pad = 6 * 1024 * 1024
    with _echo_participants(["lab-a", "lab-b"]) as (ports, sizes), ProcessSupervisor(grace_s=10.0) as sup:
        link = start_superlink(sup, tmp_path / "superlink", extra_env={"PYTHONPATH": str(REPO_ROOT)})
        addresses = {name: f"127.0.0.1:{port}" for name, port in ports.items()}
        addresses["lab-down"] = "127.0.0.1:1"  # nothing listens there: the relay must say so
        # lab-a/lab-b poll every 0.5 s (hacfed's shim) with hacfed's resident ClientApp runner; lab-down runs
        # the stock flower-supernode: Flower's sleeps and a fresh flwr-clientapp per message.
        nodes = {
            name: start_supernode(sup, tmp_path / name, superlink_address=link.fleet_address,
                                  node_config={"participant-id": name, "participant-address": address},
                                  idle_poll_s=None if name == "lab-down" else 0.5,
                                  isolation="subprocess" if name == "lab-down" else "runner")
            for name, address in addresses.items()
        }
        release = tmp_path / "release"
        run = submit_run(sup, tmp_path / "cli", control_address=link.control_address,
                         run_config=_run_config(tmp_path / "driver", rounds=2, participants=2, pad=pad,
                                                hold_until=str(release)))
        # lab-down (stock Flower, a fresh flwr-clientapp) may answer its hello after the fast labs finished
        # both rounds: the run is held open until the ServerApp has logged that failed hello.
        deadline = time.monotonic() + 300
        log = run.process.log_path
        while time.monotonic() < deadline and not (log.exists() and re.search(HELLO_DOWN, log.read_text("utf-8"))):
            time.sleep(0.5)
        release.touch()
        run_id, status = wait_for_run(run, timeout_s=300)
        stream = run.process.log_path.read_text(encoding="utf-8")
        # A second run on the same deployment whose driver cannot be built fails visibly
        # (submitted without streaming: its status is polled instead).
        bad = submit_run(sup, tmp_path / "cli-bad", control_address=link.control_address, stream=False,
                         run_config=_run_config(tmp_path / "driver-bad", driver="no_such_factory"))
        bad_id, bad_status = wait_for_run(bad, timeout_s=300, poll_s=2.0)
        bad_logs = subprocess.run(["flwr", "log", str(bad_id), bad.connection, "--show"], capture_output=True,
                                  text=True, timeout=120, env=flower_env(bad.flwr_home), check=True).stdout
        during = _running_descendants()

    assert status == "finished:completed", stream[-4000:]
    rounds = _rounds(tmp_path / "driver")
    assert [r["round"] for r in rounds] == [1, 2]
    for r, payload_size in zip(rounds, (len("round-1-lab-a|"), pad), strict=True):
        results = r["results"]
        assert set(results) == {"lab-a", "lab-b"}  # lab-down's participant never answered its hello
        for name in ("lab-a", "lab-b"):
            assert results[name]["ok"] is True, results[name]
            assert results[name]["head"].startswith(f"{name}:")
            assert results[name]["bytes"] == len(name) + 1 + payload_size
    assert re.search(HELLO_DOWN, stream), stream
    assert sizes == {"lab-a": [len("hello"), len("round-1-lab-a|"), pad],
                     "lab-b": [len("hello"), len("round-1-lab-b|"), pad]}
    # lab-a/lab-b ran every message (hello + 2 rounds) in their SuperNode's runner thread, no flwr-clientapp;
    # lab-down's one hello went through stock Flower's flwr-clientapp.
    for name in ("lab-a", "lab-b"):
        node_log = (tmp_path / name / "supernode.log").read_text(encoding="utf-8")
        assert len(re.findall(r"hacfed ClientApp runner: task \d+ \(\S+\) done", node_log)) == 3, node_log[-3000:]
        assert "flwr-clientapp" not in node_log
    down_log = (tmp_path / "lab-down" / "supernode.log").read_text(encoding="utf-8")
    assert "flwr-clientapp" in down_log and "hacfed ClientApp runner" not in down_log
    # Every relay (in the runner thread or a flwr-clientapp process) reported torch not loaded.
    relay_lines = re.findall(r"round \d+: node \d+ \((lab-[a-z]+)\) .*relay torch loaded: (\w+)", stream)
    assert sorted(name for name, _ in relay_lines) == sorted(["lab-a", "lab-b"] * 2)
    assert {flag for _, flag in relay_lines} == {"False"}
    assert len({n.node_id for n in nodes.values()}) == 3
    assert bad_status == "finished:failed"
    assert "'no_such_factory' is not a callable" in bad_logs
    assert during - before  # the deployment really ran as children of this process...
    assert _running_descendants() - before == set()  # ...and nothing of it is left
    print(f"\nrun {run_id}: seconds per round {[r['seconds'] for r in rounds]}, per node "
          f"{[{n: v['seconds'] for n, v in r['results'].items()} for r in rounds]}")


def _write_tls_files(directory: Path) -> tuple[Path, Path, Path]:
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


@pytest.mark.slow
def test_one_round_over_tls(tmp_path: Path) -> None:
    from hacfed.clients.supernode import start_supernode
    from hacfed.procs import ProcessSupervisor
    from hacfed.server.superlink import TlsFiles, start_superlink, submit_run, wait_for_run

    ca, cert, key = _write_tls_files(tmp_path / "tls")
    with _echo_participants(["lab-a"]) as (ports, sizes), ProcessSupervisor(grace_s=10.0) as sup:
        link = start_superlink(sup, tmp_path / "superlink", insecure=False,
                                             tls=TlsFiles(certfile=cert, keyfile=key, ca_certfile=ca),
                                             extra_env={"PYTHONPATH": str(REPO_ROOT)})
        start_supernode(sup, tmp_path / "lab-a", superlink_address=link.fleet_address, insecure=False,
                        root_cert=ca, idle_poll_s=0.5,
                        node_config={"participant-id": "lab-a", "participant-address": f"127.0.0.1:{ports['lab-a']}"})
        run = submit_run(sup, tmp_path / "cli", control_address=link.control_address, insecure=False,
                         root_cert=ca, run_config=_run_config(tmp_path / "driver", rounds=1, participants=1, pad=0))
        _, status = wait_for_run(run, timeout_s=300)
        superlink_log = link.process.log_tail(20000)
    assert status == "finished:completed", run.process.log_tail()
    assert "--insecure" not in link.process.argv
    assert "insecure" not in superlink_log.lower()  # flwr warns loudly whenever TLS is off
    [only_round] = _rounds(tmp_path / "driver")
    assert only_round["results"]["lab-a"]["ok"] is True
    assert sizes == {"lab-a": [len("hello"), len("round-1-lab-a|")]}
