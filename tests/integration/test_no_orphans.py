"""No process started by hacfed-server, hacfed-client or `hacfed demo` outlives it (issue 43, item 1).

Each program runs for real on loopback until its whole tree is up (the SuperLink, `flwr run`, the
ServerApp; a lab's SuperNode; the demo's server and labs with theirs); every descendant is noted
with psutil, then the program is stopped one way: 1, 2 or 3 quick Ctrl-C (SIGINT), SIGTERM, or
SIGKILL. Afterwards every noted descendant must have exited, and the coordinator's Fleet port must
bind again (the same command could resume). Whatever happens, the test kills what it noted.

hacfed-server is stopped all five ways in the default run; a lab and the demo, which take about a
minute a case on a busy 2-core machine, the two ways that failed before the child guard (three quick
Ctrl-C, SIGKILL) there, and the other three in the long tier (`./scripts/test.sh --long`).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from tests.federation import coordinator_toml
from tests.processes import BIN, cli_env
from tests.unit.test_child_guard import QUICK_S, WAYS, _binds, kill_all, wait_gone

pytestmark = pytest.mark.slow
DEFAULT_TIER = ("sigint-x3", "sigkill")  # for a lab and the demo; the other ways run in the long tier


def _tiered(ways: list[str]) -> list:
    return [way if way in DEFAULT_TIER else pytest.param(way, marks=pytest.mark.long) for way in ways]

MODEL = "tiny-llama"
SERVER_TOML = coordinator_toml("no-orphans", rounds=1000, expected_participants=1, min_participants=1,
                               round_deadline_s=600, eval_every=0)


class Program:
    """One top-level command in its own session, as a shell runs it, its output in a log."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str]) -> None:
        self.log = log
        with open(log, "ab") as out:
            # A test runner in the background may start children with SIGINT ignored; a user's
            # Ctrl-C always meets the default disposition, so restore it.
            self.popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=log.parent,
                                          start_new_session=True,
                                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        self.seen: set[int] = set()

    def wait_for(self, pattern: str, log: Path | None = None, timeout: float = 300.0) -> re.Match[str]:
        path = log or self.log
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if path.exists() and (match := re.search(pattern, path.read_text(errors="replace"))):
                return match
            assert self.popen.poll() is None, f"exited ({self.popen.returncode}):\n{self.log.read_text()[-4000:]}"
            time.sleep(0.2)
        raise AssertionError(f"no /{pattern}/ in {path} within {timeout}s:\n{path.read_text()[-4000:]}")

    def note_tree(self) -> set[int]:
        tree = {p.pid for p in psutil.Process(self.popen.pid).children(recursive=True)}
        self.seen |= tree
        return tree

    def stop_by(self, way: str) -> None:
        """Stop it `way` and check that nothing it started is left."""
        assert self.note_tree(), "nothing was started"
        for sig in WAYS[way]:
            self.popen.send_signal(sig)
            time.sleep(QUICK_S)
        self.popen.wait(timeout=180)
        left = wait_gone(self.seen)
        assert left == set(), f"{way}: outlived it: {[_describe(pid) for pid in left]}"

    def end(self) -> None:
        if self.popen.poll() is None:
            self.note_tree()
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait()
        kill_all(self.seen)


def _describe(pid: int) -> str:
    try:
        return f"{pid} {' '.join(psutil.Process(pid).cmdline())[:150]}"
    except psutil.Error:
        return str(pid)


@pytest.fixture
def programs() -> Iterator[Callable[[list[str], Path], Program]]:
    started: list[Program] = []
    env = {**cli_env(), "OMP_NUM_THREADS": "1"}

    def start(argv: list[str], log: Path) -> Program:
        started.append(Program(argv, log, env))
        return started[-1]

    try:
        yield start
    finally:
        for program in reversed(started):
            program.end()


def _server(start: Callable[[list[str], Path], Program], tmp_path: Path) -> tuple[Program, int]:
    (tmp_path / "coordinator.toml").write_text(SERVER_TOML)
    server = start([str(BIN / "hacfed-server"), "--config", str(tmp_path / "coordinator.toml"), "--insecure",
                    "--listen", "127.0.0.1:0", "--state-dir", str(tmp_path / "server")], tmp_path / "server.log")
    port = int(server.wait_for(r"ready: Fleet API on 127\.0\.0\.1:(\d+) ").group(1))
    server.wait_for(r"coordinator ready \(run no-orphans\)")  # the ServerApp runs
    return server, port


@pytest.mark.parametrize("way", list(WAYS))
def test_hacfed_server_leaves_nothing(tmp_path: Path, programs: Callable[..., Program], way: str) -> None:
    server, port = _server(programs, tmp_path)
    assert not _binds(port)
    server.stop_by(way)
    assert _binds(port), f"{way}: the Fleet port {port} is still taken"


@pytest.mark.parametrize("way", _tiered(list(WAYS)))
def test_hacfed_client_leaves_nothing(tmp_path: Path, programs: Callable[..., Program], way: str,
                                      zoo_presets: Callable[..., None]) -> None:
    zoo_presets(MODEL)
    _, port = _server(programs, tmp_path)
    lab = programs([str(BIN / "hacfed-client"), "--model", MODEL, "--server", f"127.0.0.1:{port}",
                    "--participant-id", "lab-a", "--state-dir", str(tmp_path / "lab-a"), "--coordinator-key",
                    str(tmp_path / "server" / "coordinator.pub"), "--insecure"], tmp_path / "lab-a.log")
    key = tmp_path / "lab-a" / "participant.pub"
    lab.wait_for(r"enrolment for the coordinator")
    (tmp_path / "server" / "keys" / "lab-a.pub").write_bytes(key.read_bytes())
    lab.wait_for(r"connected to 127\.0\.0\.1:\d+ as lab-a \(SuperNode id")
    lab.stop_by(way)


@pytest.mark.parametrize("way", _tiered(list(WAYS)))
def test_hacfed_demo_leaves_nothing(tmp_path: Path, programs: Callable[..., Program], way: str,
                                    zoo_presets: Callable[..., None]) -> None:
    zoo_presets("tiny-llama", "tiny-gpt2")
    state = tmp_path / "state"
    demo = programs([str(BIN / "hacfed"), "demo", "--agents", "tiny-llama,tiny-gpt2", "--rounds", "1000",
                     "--state-dir", str(state), "--metrics-out", str(tmp_path / "m.jsonl"), "--plot",
                     str(tmp_path / "p.png")], tmp_path / "demo.log")
    port = int(demo.wait_for(r"ready: Fleet API on 127\.0\.0\.1:(\d+) ", log=state / "server.log").group(1))
    for lab in ("lab-a-llama", "lab-b-gpt2"):
        demo.wait_for(rf"connected to 127\.0\.0\.1:\d+ as {lab} \(SuperNode id", log=state / f"{lab}.log")
    demo.stop_by(way)
    assert _binds(port), f"{way}: the Fleet port {port} is still taken"
