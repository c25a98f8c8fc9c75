"""No child outlives a supervising process, however it ends: 1, 2 or 3 quick Ctrl-C, SIGTERM, SIGKILL.

A stand-in for hacfed-server: a process whose `ProcessSupervisor` starts a child that holds a
listening port (as the SuperLink holds the Fleet port), takes a while to shut down on SIGTERM (as
Flower does), and has a grandchild in its group and one that left it (setsid). After the parent is
stopped, every descendant seen while it ran must be gone and the port must bind again.
`tests/integration/test_no_orphans.py` does the same with the real programs.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from hacfed.child_guard import Guard, guarded_argv
from tests.processes import still_running

PY = sys.executable

_CHILD = textwrap.dedent(
    """
    import signal, socket, subprocess, sys, time
    def slow_exit(*_):
        time.sleep(1.5)  # a graceful shutdown that takes a while: more Ctrl-C arrive meanwhile
        sys.exit(0)
    signal.signal(signal.SIGTERM, slow_exit)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    inner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    escaped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    print(f"PORT {listener.getsockname()[1]} PIDS {inner.pid} {escaped.pid}", flush=True)
    time.sleep(120)
    """
)

_PARENT = textwrap.dedent(
    """
    import os, signal, sys, time
    from pathlib import Path
    from hacfed.procs import ProcessSupervisor, wait_for_log_line
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as hacfed-server's main does
    log = Path(sys.argv[1])
    with ProcessSupervisor(grace_s=10.0) as sup:
        child = sup.start([sys.executable, "-c", sys.argv[2]], env=dict(os.environ), log_path=log, name="link")
        wait_for_log_line(log, r"PORT", timeout=60, process=child)
        print("READY", flush=True)
        time.sleep(120)
    """
)

QUICK_S = 0.05  # between the signals of one way: faster than a person's repeated Ctrl-C
WAYS = {"sigint": [signal.SIGINT], "sigint-x2": [signal.SIGINT] * 2, "sigint-x3": [signal.SIGINT] * 3,
        "sigterm": [signal.SIGTERM], "sigkill": [signal.SIGKILL]}


def _binds(port: int) -> bool:
    """Whether a new listener could bind `port`, as the SuperLink's gRPC server does (SO_REUSEADDR): only
    a socket still listening there refuses it, not the TIME_WAIT connections a stopped server leaves."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def wait_gone(pids: set[int], timeout_s: float = 60.0) -> set[int]:
    """The pids still running after up to `timeout_s` (a generous limit on a busy machine)."""
    deadline = time.monotonic() + timeout_s
    while (alive := still_running(pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive


def kill_all(pids: set[int]) -> None:
    for pid in still_running(pids):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.parametrize("way", list(WAYS))
def test_no_descendant_outlives_the_supervising_process(tmp_path: Path, way: str) -> None:
    log = tmp_path / "child.log"
    parent = subprocess.Popen([PY, "-c", _PARENT, str(log), _CHILD], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    tree: set[int] = set()
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip() == "READY"
        port = int(log.read_text().split("PORT ")[1].split()[0])
        tree = {p.pid for p in psutil.Process(parent.pid).children(recursive=True)}
        assert len(tree) >= 3, tree  # the child and its two grandchildren (and its guard)
        assert not _binds(port)
        for sig in WAYS[way]:
            parent.send_signal(sig)
            time.sleep(QUICK_S)
        parent.wait(timeout=120)
        assert wait_gone(tree) == set(), f"{way}: outlived the parent"
        assert _binds(port)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        kill_all(tree)


def test_the_guard_exits_as_its_program_did(tmp_path: Path) -> None:
    code = subprocess.run(guarded_argv([PY, "-c", "raise SystemExit(3)"], os.getpid(), 1.0), timeout=60).returncode
    assert code == 3
    code = subprocess.run(guarded_argv([PY, "-c", "import os; os.kill(os.getpid(), 15)"], os.getpid(), 1.0),
                          timeout=60).returncode
    assert code == -signal.SIGTERM
    missing = subprocess.run(guarded_argv([str(tmp_path / "nothing-here")], os.getpid(), 1.0), timeout=60,
                             capture_output=True, text=True)
    assert missing.returncode == 127 and "cannot start" in missing.stderr


def test_a_guard_whose_parent_is_already_gone_starts_nothing() -> None:
    assert Guard(parent_pid=os.getpid() + 10**6, grace_s=1.0).run(["false"]) == 1 << 8
