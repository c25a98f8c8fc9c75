"""Supervision of the child processes hacfed starts (SuperLink, SuperNodes, `flwr run`).

Why this module exists: Flower's daemons start their own children (`flower-superexec`,
then one `flwr-serverapp` / `flwr-clientapp` per run or message), and a killed parent can
leave those behind. So every child hacfed starts gets its own process group
(`start_new_session=True`) and is ended through that group, by pid (`os.killpg`), never by
name. A `ProcessSupervisor` used as a context manager stops everything it started when the
block ends, also on exceptions, Ctrl-C (however many), SIGTERM/SIGHUP and interpreter exit
(atexit). Where none of that runs (SIGKILL), each child's guard (`hacfed.child_guard`, which
starts it) sees its parent gone and ends the child's whole tree.

    with ProcessSupervisor() as sup:
        link = sup.start(["flower-superlink", ...], env=flower_env(home), log_path=log, name="superlink")
        wait_for_log_line(log, r"Starting Fleet API", timeout=30, process=link)
"""

from __future__ import annotations

import atexit
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from hacfed.child_guard import guarded_argv
from hacfed.proc_table import descendants, group_exists, pgid_or_none, signal_group

DEFAULT_GRACE_S = 5.0


class ProcessError(RuntimeError):
    """A supervised process failed to start or exited before it became ready."""


def flower_env(
    flwr_home: Path, *, base: Mapping[str, str] | None = None, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Environment for one Flower process: its own FLWR_HOME, no telemetry, no update check.

    The directory of the running interpreter goes first on PATH because the SuperLink and
    SuperNode start `flower-superexec`, `flwr-serverapp` and `flwr-clientapp` by bare name:
    they must resolve to this environment's Flower, not to whatever else is on PATH.
    """
    env = dict(os.environ if base is None else base)
    flwr_home = Path(flwr_home)
    flwr_home.mkdir(parents=True, exist_ok=True)
    env["FLWR_HOME"] = str(flwr_home)
    env["FLWR_TELEMETRY_ENABLED"] = "0"
    env["FLWR_DISABLE_UPDATE_CHECK"] = "1"
    # The SuperLink reads this as the default of --disable-runtime-dependency-installation;
    # set both so no code path ever runs `uv sync` (which could pull a CUDA torch).
    env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    bin_dir = str(Path(sys.executable).parent)
    path_parts = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != bin_dir]
    env["PATH"] = os.pathsep.join([bin_dir, *path_parts])
    if extra:
        env.update(extra)
    return env


@dataclass
class ManagedProcess:
    """One child process, leader of its own process group, output going to `log_path`."""

    name: str
    argv: tuple[str, ...]
    log_path: Path
    popen: subprocess.Popen[bytes] = field(repr=False)
    log_offset: int = 0  # where this process's output starts in a log shared with earlier runs

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def returncode(self) -> int | None:
        return self.popen.poll()

    def log_tail(self, max_chars: int = 4000) -> str:
        """The end of the process's log, for error messages."""
        if not self.log_path.exists():
            return ""
        text = self.log_path.read_text(encoding="utf-8", errors="replace")
        return text[-max_chars:]

    def wait(self, timeout: float) -> int:
        """Wait for the process to exit; raises subprocess.TimeoutExpired after `timeout`."""
        return self.popen.wait(timeout=timeout)

    def stop(self, grace_s: float = DEFAULT_GRACE_S) -> int | None:
        """SIGTERM the whole process group, wait up to `grace_s`, then SIGKILL what is left.

        Descendants that moved to another process group are found through /proc before the
        group is signalled and killed too, so nothing this process started survives it.
        """
        escaped = [p for p in descendants(self.pid) if pgid_or_none(p.pid) != self.pid]
        signal_group(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and (self.alive() or group_exists(self.pid)):
            time.sleep(0.05)
        signal_group(self.pid, signal.SIGKILL)
        for proc in escaped:
            proc.kill_if_same()
        try:
            code = self.popen.wait(timeout=max(grace_s, 1.0))
        except subprocess.TimeoutExpired as exc:
            raise ProcessError(f"{self.name} (pid {self.pid}) survived SIGKILL") from exc
        # SIGKILL is asynchronous: wait until the whole tree has really stopped running.
        deadline = time.monotonic() + max(grace_s, 1.0)
        while group_exists(self.pid) or any(p.running() for p in escaped):
            if time.monotonic() >= deadline:
                raise ProcessError(f"processes of {self.name} (pgid {self.pid}) survived SIGKILL")
            time.sleep(0.02)
        return code


def start_process(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    log_path: Path,
    name: str,
    cwd: Path | None = None,
    grace_s: float = DEFAULT_GRACE_S,
) -> ManagedProcess:
    """Start `argv` in a new session (own process group); stdout and stderr go to `log_path`.

    It runs under a `hacfed.child_guard`, which leads the group, is the pid returned, exits as
    `argv` does, and ends the whole tree (SIGTERM, SIGKILL after `grace_s`) once this process is
    gone, however it ended."""
    if not argv:
        raise ValueError(f"argv for {name!r} is empty")
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_offset = log_path.stat().st_size if log_path.exists() else 0
    with open(log_path, "ab") as log_file:
        popen = subprocess.Popen(  # noqa: S603 - argv is built by hacfed, never by a shell
            guarded_argv(list(argv), os.getpid(), grace_s),
            env=dict(env),
            cwd=str(cwd) if cwd is not None else None,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return ManagedProcess(name=name, argv=tuple(argv), log_path=log_path, popen=popen, log_offset=log_offset)


_LIVE_SUPERVISORS: weakref.WeakSet[ProcessSupervisor] = weakref.WeakSet()
_ATEXIT_LOCK = threading.Lock()
_ATEXIT_REGISTERED = False


def _stop_live_supervisors() -> None:
    for supervisor in list(_LIVE_SUPERVISORS):
        supervisor.stop_all()


def _raise_system_exit(signum: int, _frame: FrameType | None) -> None:
    # Turning SIGTERM/SIGHUP into SystemExit unwinds the `with` blocks, which stop children.
    raise SystemExit(128 + signum)


class ProcessSupervisor:
    """Starts processes and stops all of them (newest first) when the `with` block ends.

    With `handle_signals=True` (default) and when entered from the main thread, SIGTERM and
    SIGHUP raise SystemExit in the main thread for the duration of the block so that cleanup
    runs; the previous handlers are restored on exit. An atexit hook is the last resort.
    """

    _HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGHUP)

    def __init__(self, grace_s: float = DEFAULT_GRACE_S, *, handle_signals: bool = True) -> None:
        if grace_s <= 0:
            raise ValueError(f"grace_s must be > 0, got {grace_s}")
        self.grace_s = grace_s
        self._handle_signals = handle_signals
        self._processes: list[ManagedProcess] = []
        self._lock = threading.Lock()
        self._previous_handlers: dict[int, object] = {}
        _register_atexit()
        _LIVE_SUPERVISORS.add(self)

    @property
    def processes(self) -> tuple[ManagedProcess, ...]:
        return tuple(self._processes)

    def start(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        log_path: Path,
        name: str,
        cwd: Path | None = None,
    ) -> ManagedProcess:
        proc = start_process(argv, env=env, log_path=log_path, name=name, cwd=cwd, grace_s=self.grace_s)
        with self._lock:
            self._processes.append(proc)
        return proc

    def stop(self, proc: ManagedProcess) -> int | None:
        """Stop one supervised process (and its group) before the block ends."""
        code = proc.stop(self.grace_s)
        with self._lock:
            if proc in self._processes:
                self._processes.remove(proc)
        return code

    def stop_all(self) -> None:
        """Stop every process still supervised, newest first (children before their server)."""
        with self._lock:
            to_stop = list(reversed(self._processes))
            self._processes.clear()
        errors = []
        for proc in to_stop:
            try:
                proc.stop(self.grace_s)
            except ProcessError as exc:  # keep stopping the others, report at the end
                errors.append(str(exc))
        if errors:
            raise ProcessError("; ".join(errors))

    def __enter__(self) -> ProcessSupervisor:
        if self._handle_signals and threading.current_thread() is threading.main_thread():
            for sig in self._HANDLED_SIGNALS:
                self._previous_handlers[sig] = signal.signal(sig, _raise_system_exit)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if threading.current_thread() is threading.main_thread():
            # A second Ctrl-C or SIGTERM must not interrupt the cleanup (a user presses Ctrl-C
            # three times): the rest of the children would outlive this process.
            if (handler := signal.getsignal(signal.SIGINT)) is not None:
                self._previous_handlers.setdefault(signal.SIGINT, handler)
            for sig in self._previous_handlers:
                signal.signal(sig, signal.SIG_IGN)
        try:
            self.stop_all()
        finally:
            for sig, handler in self._previous_handlers.items():
                signal.signal(sig, handler)  # type: ignore[arg-type]
            self._previous_handlers.clear()
            _LIVE_SUPERVISORS.discard(self)


def _register_atexit() -> None:
    global _ATEXIT_REGISTERED
    with _ATEXIT_LOCK:
        if not _ATEXIT_REGISTERED:
            atexit.register(_stop_live_supervisors)
            _ATEXIT_REGISTERED = True


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago. Racy by nature: callers retry if the bind fails."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def wait_for_port(
    host: str, port: int, timeout: float, *, process: ManagedProcess | None = None
) -> None:
    """Block until a TCP connect to host:port succeeds; fail early if `process` exits."""
    deadline = time.monotonic() + timeout
    while True:
        _check_alive(process, f"waiting for port {host}:{port}")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"nothing listens on {host}:{port} after {timeout:.1f}s") from None
            time.sleep(0.1)


def wait_for_log_line(
    path: Path, pattern: str, timeout: float, *, process: ManagedProcess | None = None
) -> re.Match[str]:
    """Block until a line of the log file at `path` matches the regex `pattern`; return the match.

    With `process` writing to `path`, only that process's output counts (not lines an earlier
    run appended to the same log), and its exit ends the wait with a `ProcessError`.
    """
    regex = re.compile(pattern)
    deadline = time.monotonic() + timeout
    path = Path(path)
    offset = process.log_offset if process is not None and process.log_path == path else 0
    while True:
        exited = process is not None and not process.alive()  # checked before reading: no race
        if path.exists():
            with open(path, "rb") as file:
                file.seek(offset)
                text = file.read().decode("utf-8", errors="replace")
            for line in text.splitlines():
                if (match := regex.search(line)) is not None:
                    return match
        if exited:
            _check_alive(process, f"waiting for /{pattern}/ in {path.name}")
        if time.monotonic() >= deadline:
            tail = process.log_tail() if process is not None else ""
            raise TimeoutError(f"no line matching /{pattern}/ in {path} after {timeout:.1f}s\n{tail}")
        time.sleep(0.1)


def _check_alive(process: ManagedProcess | None, doing: str) -> None:
    if process is not None and not process.alive():
        raise ProcessError(
            f"{process.name} (pid {process.pid}) exited with code {process.returncode()} "
            f"while {doing}; log tail:\n{process.log_tail()}"
        )
