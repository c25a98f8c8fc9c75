"""The tests' process helper: a CLI process in its own session with its output in a log file, and the
checks that nothing a test started is left running.

    proc = Proc("server", [str(BIN / "hacfed-server"), ...], tmp_path / "server.log", env)
    proc.wait_for(r"ready: Fleet API on (\\S+) ").group(1)
    proc.stop()                      # SIGTERM to its process group, SIGKILL to the group after 30 s

Every process is ended by its pid or by the id of the process group it leads, never by name.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # this venv's hacfed, hacfed-server and hacfed-client


def cli_env() -> dict[str, str]:
    """What the CLI processes a test starts run with: this environment, unbuffered output, and the clone's
    model cache (HACFED_HOME, unless set)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.setdefault("HACFED_HOME", str(REPO / ".hacfed-home"))
    return env


class Proc:
    """A CLI process in its own session (it leads a process group), stdout and stderr appended to `log`;
    it runs in `cwd` (default: the log's folder)."""

    def __init__(self, name: str, argv: list[str], log: Path, env: dict[str, str], cwd: Path | None = None) -> None:
        self.name, self.argv, self.log = name, argv, log
        with open(log, "ab") as out:
            self.popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                          cwd=cwd or log.parent, start_new_session=True)

    def text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def wait_for(self, pattern: str, timeout: float = 240.0) -> re.Match[str]:
        """The first match of `pattern` in the output; fails once the process exited or `timeout` passed."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = re.search(pattern, self.text())
            if match:
                return match
            if self.popen.poll() is not None:
                raise AssertionError(f"{self.name} exited ({self.popen.returncode}) before /{pattern}/:\n"
                                     f"{self.text()[-5000:]}")
            time.sleep(0.2)
        raise AssertionError(f"{self.name}: no /{pattern}/ within {timeout}s:\n{self.text()[-5000:]}")

    def exit_code(self, timeout: float = 240.0) -> int:
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} still running after {timeout}s:\n{self.text()[-5000:]}") from None

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout: float = 30.0, group: bool = True) -> int:
        """`sig` to the process group it leads (`group=False`: to the process alone, as a shell's Ctrl-C
        reaches a program that handles it itself), then SIGKILL to the whole group if it outlives
        `timeout`; returns its exit code."""
        if self.popen.poll() is None:
            if group:
                os.killpg(self.popen.pid, sig)
            else:
                os.kill(self.popen.pid, sig)
            try:
                return self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
        return self.popen.wait()


def running_descendants() -> set[int]:
    """The pids of this test process's live descendants."""
    return {p.pid for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE}


def still_running(pids: set[int]) -> set[int]:
    """Those of `pids` that are alive (not zombies)."""
    alive = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.add(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def wait_nothing_left(before: set[int], timeout_s: float = 30.0) -> None:
    """Every process started since `before` was taken has exited (a stopped tree may take a moment)."""
    deadline = time.monotonic() + timeout_s
    while running_descendants() - before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert running_descendants() - before == set()
