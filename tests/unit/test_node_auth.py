"""hacfed-server keeps Flower's registered SuperNode keys equal to its registry (`hacfed.server.node_auth`).

A fake `flwr supernode` CLI stands in for the SuperLink's Control API here; the real one runs in
the slow tests (tests/integration/test_tls_walkthrough.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from hacfed.clients.enrol import ensure_lab_keys, rotate_lab_keys
from hacfed.enrolment import parse_enrolment
from hacfed.server.node_auth import BINDINGS_FILE, FlowerCliError, NodeAuthSync, read_bindings
from hacfed.server.registry import load_registry, register, revoke


class FakeFlwr:
    """The SuperLink's node registrations: public key text -> node id; a key stays in use forever."""

    def __init__(self) -> None:
        self.nodes: dict[int, str] = {}
        self.unregistered: set[int] = set()
        self.calls: list[str] = []
        self.fail_next_register: str | None = None

    def register(self, public_key_path: Path) -> int:
        self.calls.append("register")
        if self.fail_next_register:
            message, self.fail_next_register = self.fail_next_register, None
            raise FlowerCliError(message)
        key = public_key_path.read_text()
        if key in self.nodes.values():
            raise FlowerCliError("The provided public key is already in use by another SuperNode.")
        node_id = 1000 + len(self.nodes)
        self.nodes[node_id] = key
        return node_id

    def unregister(self, node_id: int) -> None:
        self.calls.append(f"unregister {node_id}")
        if node_id not in self.nodes or node_id in self.unregistered:
            raise FlowerCliError("Node ID not found for this account.")
        self.unregistered.add(node_id)

    def registered_nodes(self) -> set[int]:
        return set(self.nodes) - self.unregistered


class Setup:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp, self.keys = tmp_path, tmp_path / "keys"
        self.cli, self.lines = FakeFlwr(), []
        self.path = tmp_path / BINDINGS_FILE
        self.sync = NodeAuthSync(self.keys, self.path, self.cli, self.lines.append)  # type: ignore[arg-type]

    def enrol(self, pid: str) -> None:
        register(self.keys, parse_enrolment(ensure_lab_keys(self.tmp / pid, pid).line))


def test_every_registered_lab_gets_its_supernode_key_registered_and_bound(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    s.enrol("lab-a")
    s.enrol("lab-b")
    s.sync.sync()
    bindings = read_bindings(s.path)
    assert {pid: b.node_id for pid, b in bindings.items()} == {"lab-a": 1000, "lab-b": 1001}
    assert not s.sync.changed()
    s.sync.sync()
    assert s.cli.calls == ["register", "register"]  # nothing more to do


def test_a_revoked_lab_has_its_flower_node_unregistered(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    s.enrol("lab-a")
    s.enrol("lab-b")
    s.sync.sync()
    revoke(s.keys, "lab-b")
    assert s.sync.changed()
    s.sync.sync()
    assert s.cli.unregistered == {1001}
    assert set(read_bindings(s.path)) == {"lab-a"}
    assert any("unregistered the SuperNode of lab-b (node 1001): revoked" in line for line in s.lines)


def test_a_lab_re_enrolled_with_new_keys_gets_a_new_node(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    s.enrol("lab-b")
    s.sync.sync()
    revoke(s.keys, "lab-b")
    rotate_lab_keys(tmp_path / "lab-b")
    s.enrol("lab-b")
    s.sync.sync()
    assert s.cli.unregistered == {1000}
    assert read_bindings(s.path)["lab-b"].node_id == 1001


def test_a_registration_lost_in_a_crash_is_refused_not_guessed(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    s.enrol("lab-a")
    entry = load_registry(s.keys).entries["lab-a"]
    # hacfed-server died between `flwr supernode register` and writing the node id down:
    s.cli.register(entry.supernode_path)
    s.path.write_text(json.dumps({"nodes": {}, "pending": {"lab-a": entry.supernode_hash}}))
    s.sync.sync()
    assert "lab-a" not in read_bindings(s.path)
    assert any(line.startswith("REFUSED the SuperNode key of lab-a: hacfed-server stopped while registering it")
               and "--rotate" in line for line in s.lines)


def test_a_failed_registration_is_said_once_and_does_not_block_the_others(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    s.enrol("lab-a")
    s.enrol("lab-b")
    s.cli.fail_next_register = "The provided public key is already in use by another SuperNode."
    s.sync.sync()
    s.sync.sync()
    assert set(read_bindings(s.path)) == {"lab-b"}
    assert sum("REFUSED the SuperNode key of lab-a" in line for line in s.lines) == 1


def test_bindings_of_a_superlink_that_forgot_its_nodes_are_dropped_and_renewed(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    s.enrol("lab-a")
    s.sync.sync()
    s.cli = s.sync.cli = FakeFlwr()  # a SuperLink started on a fresh database
    s.cli.nodes = {5000 + i: "other" for i in range(3)}
    s.sync.sync(check_superlink=True)
    assert read_bindings(s.path)["lab-a"].node_id == 1003
