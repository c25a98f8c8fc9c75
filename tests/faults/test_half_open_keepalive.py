"""R6 under a half-open connection: the coordinator's host vanishes without a FIN (issue 42).

tests/faults/test_partition_netns.py takes a link down. Here the connection stays "up" for TCP: a
proxy on loopback between a lab's SuperNode and the SuperLink (both real processes, hacfed's
wrappers) stops forwarding and stops reading on command, without closing either socket, as when the
coordinator's host freezes or vanishes behind a middlebox that keeps the flow. The kernel still
acknowledges every segment, so TCP itself never notices; only gRPC keepalive
(`hacfed.flower_keepalive`: an HTTP/2 PING after KEEPALIVE_TIME_MS, the connection given up when
no answer comes within KEEPALIVE_TIMEOUT_MS) does. Checked:

- the SuperNode's first reconnect line comes within keepalive time + timeout of the freeze (plus
  slack for a busy machine); without keepalive its pull waits on the frozen connection forever;
- it then connects again through the proxy (a new connection, forwarded) by itself.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from pathlib import Path

import pytest

from hacfed.clients.backoff import RECONNECT_MARK
from hacfed.clients.supernode import start_supernode
from hacfed.flower_keepalive import KEEPALIVE_TIME_MS, KEEPALIVE_TIMEOUT_MS
from hacfed.procs import ProcessSupervisor, flower_env, free_port, wait_for_log_line
from hacfed.server.superlink import superlink_argv

pytestmark = pytest.mark.slow

DETECT_S = (KEEPALIVE_TIME_MS + KEEPALIVE_TIMEOUT_MS) / 1000
DETECT_SLACK_S = 5.0  # this test's polling of the log, a busy machine
WAIT_S = 120.0  # far past the bound: how long the test waits for a SuperNode that never notices


class FreezingProxy:
    """A TCP proxy on 127.0.0.1: each connection is forwarded to `upstream` until `freeze()`, after
    which the connections open at that moment are neither read nor written nor closed (until
    `close()`); connections made later are forwarded."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._lock = threading.Lock()
        self._open: list[tuple[socket.socket, socket.socket, threading.Event]] = []
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            frozen = threading.Event()
            with self._lock:
                self._open.append((client, server, frozen))
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(src, dst, frozen), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, frozen: threading.Event) -> None:
        src.settimeout(0.1)
        while not self._closed.is_set():
            if frozen.is_set():  # the host vanished: nothing read, nothing sent, nothing closed
                time.sleep(0.1)
                continue
            try:
                data = src.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
            if not data or frozen.is_set():
                if not data:
                    break
                continue  # read just as the freeze came: dropped, as by the vanished host
            try:
                dst.sendall(data)
            except OSError:
                break
        if not frozen.is_set():
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def freeze(self) -> int:
        """Freeze every connection open now; returns how many."""
        with self._lock:
            for _, _, frozen in self._open:
                frozen.set()
            return len(self._open)

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        with self._lock:
            for client, server, _ in self._open:
                client.close()
                server.close()


def _first_line_after(path: Path, offset: int, needle: str, timeout: float) -> tuple[float, str]:
    """When (monotonic) a line holding `needle` appeared in the log after byte `offset`, and the line."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(path, "rb") as fh:
            fh.seek(offset)
            for line in fh.read().decode("utf-8", errors="replace").splitlines():
                if needle in line:
                    return time.monotonic(), line
        time.sleep(0.1)
    raise AssertionError(f"no {needle!r} in {path} within {timeout}s:\n{path.read_text(errors='replace')[-3000:]}")


def test_a_supernode_notices_a_frozen_coordinator_by_keepalive_and_connects_again(tmp_path: Path) -> None:
    state = tmp_path / "coordinator"
    state.mkdir()
    fleet_port = free_port()
    with ProcessSupervisor(handle_signals=False) as sup:
        argv = superlink_argv(host="127.0.0.1", fleet_port=fleet_port, control_port=0, serverappio_port=0,
                              tls=None, database=state / "superlink.db")
        link_log = state / "superlink.log"
        link = sup.start(argv, env=flower_env(state / "flwr-home"), log_path=link_log, name="superlink", cwd=state)
        wait_for_log_line(link_log, r"Starting Fleet API\b.* on (\S+)$", 120.0, process=link)
        proxy = FreezingProxy(("127.0.0.1", fleet_port))
        try:
            node = start_supernode(sup, tmp_path / "lab-a", superlink_address=proxy.address,
                                   node_config={"participant-id": "lab-a", "participant-address": "127.0.0.1:1"},
                                   ready_timeout_s=120.0)
            log = node.process.log_path
            offset = log.stat().st_size
            assert proxy.freeze() >= 1  # the SuperNode's connection, now half-open
            frozen_at = time.monotonic()
            noticed_at, line = _first_line_after(log, offset, RECONNECT_MARK, timeout=WAIT_S)
            detected = noticed_at - frozen_at
            assert detected <= DETECT_S + DETECT_SLACK_S, f"the frozen coordinator was noticed after {detected:.1f}s"
            _first_line_after(log, offset, "connected to the coordinator again", timeout=WAIT_S)
            assert node.process.alive(), node.process.log_tail(3000)
        finally:
            proxy.close()
    said = re.sub(r"\s+", " ", line)
    print(f"\nfrozen connection noticed after {detected:.1f}s (keepalive {DETECT_S:.0f}s): {said}")
