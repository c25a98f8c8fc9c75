"""Flower's SuperNode authentication, kept equal to hacfed's registry (hacfed-server's process).

With TLS, hacfed-server starts the SuperLink with `--enable-supernode-auth`: only a SuperNode whose
public key was registered with the SuperLink can connect, and Flower then knows it under the node
id that registration returned. `NodeAuthSync` registers every registered lab's SuperNode key (the
registry: `hacfed.server.registry`) with `flwr supernode register`, unregisters a revoked or
replaced one with `flwr supernode unregister` (its SuperNode is cut off at its next request), and
writes which node id belongs to which lab to `<state>/supernode-nodes.json` (the "bindings"). The
round driver reads the bindings (`hacfed.server.membership`): a hello is accepted only from the node
Flower authenticated with that lab's key. hacfed-server syncs when the SuperLink starts and within
about a second of any change to the registry, also while a run is going on.

Flower 1.32 facts this relies on (checked in its source and tried): registration goes through the
Control API (which listens on 127.0.0.1 only); `--format json` prints {"success": ..., "node-id"}
or {"success": false, "error-message"} with exit code 0 either way; `flwr supernode ls` lists node
ids and statuses but not keys; a key stays "in use" after its node is unregistered, so a revoked
key can never be registered again (the lab rotates its keys: `hacfed-client keys --rotate`).

Bindings file: {"nodes": {"<id>": {"node_id": N, "supernode_key": "<sha256 hex>"}}, "pending":
{"<id>": "<sha256 hex>"}}. "pending" marks a registration in flight: if hacfed-server dies between
`flwr supernode register` and writing the node id, the key is in use under an id nobody recorded;
that lab is then told to rotate its keys rather than being silently bound to a guess.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hacfed.envelope import write_atomic
from hacfed.procs import flower_env
from hacfed.server.registry import load_registry, signature

BINDINGS_FILE = "supernode-nodes.json"
CONNECTION = "hacfed-admin"


@dataclass(frozen=True)
class Binding:
    node_id: int
    supernode_key: str  # sha256 hex of the OpenSSH public key line


def read_bindings(path: Path) -> dict[str, Binding]:
    """participant id -> Binding; {} when there is no (readable) file."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        return {pid: Binding(int(b["node_id"]), str(b["supernode_key"])) for pid, b in data.get("nodes", {}).items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


class FlowerCliError(RuntimeError):
    pass


class FlwrCli:
    """`flwr supernode ...` against the SuperLink's Control API (the connection in `flwr_home`)."""

    def __init__(self, flwr_home: Path, connection: str = CONNECTION, timeout_s: float = 120.0) -> None:
        self.flwr_home, self.connection, self.timeout_s = Path(flwr_home), connection, timeout_s

    def _json(self, *args: str) -> dict:
        result = subprocess.run(["flwr", "supernode", *args, self.connection, "--format", "json"],
                                env=flower_env(self.flwr_home), capture_output=True, text=True, timeout=self.timeout_s,
                                start_new_session=True, check=False)
        try:
            data = json.loads(result.stdout)
        except json.JSONDecodeError:
            raise FlowerCliError(f"flwr supernode {args[0]} gave no JSON (exit {result.returncode}): "
                                 f"{(result.stdout + result.stderr)[-1500:]}") from None
        if not data.get("success"):
            message = str(data.get("error-message", "")).split("\n\n")[-1].strip()
            raise FlowerCliError(message or f"flwr supernode {args[0]} failed")
        return data

    def register(self, public_key_path: Path) -> int:
        return int(self._json("register", str(public_key_path))["node-id"])

    def unregister(self, node_id: int) -> None:
        self._json("unregister", str(node_id))

    def registered_nodes(self) -> set[int]:
        """Node ids the SuperLink still accepts (any status but "unregistered")."""
        nodes = self._json("ls")["nodes"]
        return {int(n["node-id"]) for n in nodes if n.get("status") != "unregistered"}


class NodeAuthSync:
    def __init__(self, keys_dir: Path, bindings_path: Path, cli: FlwrCli, say: Callable[[str], None]) -> None:
        self.keys_dir, self.path, self.cli, self.say = Path(keys_dir), Path(bindings_path), cli, say
        self._seen: tuple | None = None
        self._failed: dict[str, str] = {}  # participant id -> key hash whose registration failed (said once)
        self._told: set[str] = set()  # registry problems already said

    def _read(self) -> tuple[dict[str, dict], dict[str, str]]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            return dict(data.get("nodes", {})), dict(data.get("pending", {}))
        except (OSError, ValueError):
            return {}, {}

    def _write(self, nodes: dict[str, dict], pending: dict[str, str]) -> None:
        text = json.dumps({"nodes": nodes, "pending": pending}, indent=1, sort_keys=True) + "\n"
        write_atomic(self.path, text.encode("utf-8"), 0o644)

    def changed(self) -> bool:
        return signature(self.keys_dir) != self._seen

    def sync(self, *, check_superlink: bool = False) -> None:
        """Make the SuperLink's registrations match the registry. `check_superlink` first drops
        bindings whose node the SuperLink does not know (a SuperLink started on a fresh database)."""
        self._seen = signature(self.keys_dir)
        registry = load_registry(self.keys_dir)
        nodes, pending = self._read()
        if check_superlink and nodes:
            known = self.cli.registered_nodes()
            nodes = {pid: b for pid, b in nodes.items() if int(b["node_id"]) in known}
            self._write(nodes, pending)
        for pid, bound in sorted(nodes.items()):
            entry = registry.entries.get(pid)
            if entry is not None and entry.supernode_hash == bound["supernode_key"]:
                continue
            try:
                self.cli.unregister(int(bound["node_id"]))
            except FlowerCliError as exc:
                if "not found" not in str(exc).lower():
                    self.say(f"could not unregister the SuperNode of {pid} (node {bound['node_id']}): {exc}")
                    continue
            del nodes[pid]
            self._write(nodes, pending)
            self.say(f"unregistered the SuperNode of {pid} (node {bound['node_id']}): "
                     f"{'revoked' if entry is None else 'its key changed'}")
        for pid, entry in sorted(registry.entries.items()):
            key = entry.supernode_hash
            if pid in nodes or entry.supernode_path is None or self._failed.get(pid) == key:
                continue
            if pending.get(pid) == key:  # registered by a hacfed-server that died before recording it
                self._refuse(pid, key, "hacfed-server stopped while registering it, so its Flower node id is unknown")
                continue
            pending[pid] = key
            self._write(nodes, pending)
            try:
                node_id = self.cli.register(entry.supernode_path)
            except FlowerCliError as exc:
                del pending[pid]
                self._write(nodes, pending)
                self._refuse(pid, key, str(exc))
                continue
            del pending[pid]
            nodes[pid] = {"node_id": node_id, "supernode_key": key}
            self._write(nodes, pending)
            self.say(f"registered the SuperNode key of {pid} with the SuperLink (node {node_id})")
        for problem in sorted(set(registry.problems) - self._told):
            self._told.add(problem)
            self.say(f"registry: {problem}")

    def _refuse(self, pid: str, key: str | None, why: str) -> None:
        self._failed[pid] = key or ""
        self.say(f"REFUSED the SuperNode key of {pid}: {why}. The lab must create a new SuperNode key "
                 f"(hacfed-client keys --rotate ...) and be registered again (revoke {pid} first)")
