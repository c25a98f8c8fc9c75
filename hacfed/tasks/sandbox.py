"""A persistent, resource-limited worker process for running untrusted-input code (security.md T2/S8).

Shared by both sides: the coordinator re-verifies every reward with it and a lab's participant
scores its own rollouts with it. This module is the parent side (`SandboxedWorker`), which runs in
the caller's process; the worker's own main loop is `hacfed.tasks.sandbox_worker`.

Why a subprocess: verifying model text means parsing it with sympy-based code that was never written
to face hostile input (exponent towers, pathological nesting, `sympify`-style evaluation). Running it
in the caller's process would let one rollout hang or crash the coordinator. The worker is persistent
so each item costs one pipe round trip, not a Python start-up plus imports.

Bounds on the child (set by the child on itself before it reads any request, hard == soft):
  RLIMIT_AS (address space), RLIMIT_FSIZE 0 (no file can grow), RLIMIT_CORE 0, RLIMIT_CPU (a
  per-item soft limit re-armed before each request under a lifetime hard limit), RLIMIT_NPROC
  (set after warm-up, so imports may start threads but requests cannot fork; the kernel does not
  enforce it for uid 0), a fresh temp cwd (mode 0500), a minimal environment, `python -I -B`, and
  no network: under `unshare -n` when run as root (`unshare -r -n` otherwise).

No network isolation is a refusal, not a fallback: with the default `network = "required"`,
building `SandboxLimits` where `unshare` cannot make an empty network namespace raises
`SandboxIsolationError` (a ValueError: the CLIs print its one line before anything starts). Only
the named opt-out `network = "off-unsafe"` runs workers on the host's network; it is warned about
on stderr once per process, so every run of hacfed-server or hacfed-client repeats it.
The parent enforces a wall timeout per request: past it the whole process group is SIGKILLed and
the next request starts a fresh worker.

Wire format, both directions: a 4-byte big-endian length, then that many bytes of UTF-8 JSON.

    worker = SandboxedWorker("hacfed.tasks.math_worker:worker_handler", SandboxLimits(timeout_s=5))
    worker.call({"gold": "72", "answer": "\\frac{144}{2}"})  # -> {"equal": True}; SandboxAbort on failure
"""

from __future__ import annotations

import json
import logging
import math
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal, Mapping

from hacfed.tasks.sandbox_worker import FRAME_HEADER, MAX_REQUEST_BYTES, write_all

VERIFIER_ABORT = "HACFED-E-VERIFIER-ABORT"
_log = logging.getLogger(__name__)

NetworkIsolation = Literal["required", "off-unsafe"]
NETWORK_CHOICES = ("required", "off-unsafe")
UNSAFE_WARNING = ("hacfed sandbox: WARNING: network = \"off-unsafe\": verifier workers run WITHOUT network "
                  "isolation; hostile model text that reaches code execution can connect out")


class SandboxAbort(Exception):
    """One request could not be answered (timeout, worker death, refused, protocol error).

    `reason` is short, fixed-vocabulary text meant for a Verdict; it never echoes request content."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class SandboxStartError(RuntimeError):
    """The worker could not be started at all: a broken installation or configuration, not bad input."""


class SandboxIsolationError(SandboxStartError, ValueError):
    """Network isolation is required and cannot be had here. A ValueError too, so every CLI turns it
    into its one error line before it creates a file."""


@dataclass(frozen=True)
class SandboxLimits:
    """timeout_s: wall time per request in the parent (the child interrupts itself at 80 % of it).
    cpu_s_per_item: CPU seconds per request (default: ceil(timeout_s) + 1).
    cpu_s_lifetime: hard CPU limit of one worker; it retires (and is replaced) before reaching it.
    memory_bytes: RLIMIT_AS of the worker. max_processes: RLIMIT_NPROC after warm-up (None: unset).
    network: "required" (default) refuses to build where `unshare` cannot isolate the worker's
    network (SandboxIsolationError); "off-unsafe" never isolates and warns once per process."""

    timeout_s: float = 5.0
    cpu_s_per_item: int | None = None
    cpu_s_lifetime: int = 3600
    memory_bytes: int = 1536 << 20
    max_processes: int | None = 0
    network: NetworkIsolation = "required"
    startup_timeout_s: float = 60.0
    max_reply_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        timeout = self.timeout_s
        if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and 0 < timeout <= 600):
            raise ValueError(f"SandboxLimits.timeout_s must be in (0, 600], got {self.timeout_s!r}")
        if self.cpu_s_per_item is not None and (not isinstance(self.cpu_s_per_item, int) or self.cpu_s_per_item < 1):
            raise ValueError(f"SandboxLimits.cpu_s_per_item must be an int >= 1 or None, got {self.cpu_s_per_item!r}")
        if not isinstance(self.cpu_s_lifetime, int) or self.cpu_s_lifetime < 4 * self.item_cpu_s:
            raise ValueError(
                f"SandboxLimits.cpu_s_lifetime must be an int >= 4 x the per-item CPU limit "
                f"({4 * self.item_cpu_s}), got {self.cpu_s_lifetime!r}"
            )
        if not isinstance(self.memory_bytes, int) or self.memory_bytes < 256 << 20:
            raise ValueError(f"SandboxLimits.memory_bytes must be an int >= 256 MiB, got {self.memory_bytes!r}")
        if self.max_processes is not None and (not isinstance(self.max_processes, int) or self.max_processes < 0):
            raise ValueError(f"SandboxLimits.max_processes must be an int >= 0 or None, got {self.max_processes!r}")
        if self.network not in NETWORK_CHOICES:
            raise ValueError(f"SandboxLimits.network must be \"required\" or \"off-unsafe\" (no network isolation), "
                             f"got {self.network!r}")
        if not (isinstance(self.startup_timeout_s, (int, float)) and self.startup_timeout_s > 0):
            raise ValueError(f"SandboxLimits.startup_timeout_s must be > 0, got {self.startup_timeout_s!r}")
        if not isinstance(self.max_reply_bytes, int) or self.max_reply_bytes < 1024:
            raise ValueError(f"SandboxLimits.max_reply_bytes must be an int >= 1024, got {self.max_reply_bytes!r}")
        # Last, so a bad value is named before the host is probed; where values enter, so a CLI
        # refuses at its start, not at the first sample it has to verify.
        if self.network == "required":
            require_network_isolation()
        else:
            _warn_unsafe_once()

    @property
    def item_cpu_s(self) -> int:
        return self.cpu_s_per_item if self.cpu_s_per_item is not None else math.ceil(self.timeout_s) + 1


@cache
def network_isolation_prefix() -> tuple[str, ...] | None:
    """The command prefix that puts a child in an empty network namespace, or None where that fails.

    Probed once per process: `unshare -n` needs root; unprivileged users need a user namespace too."""
    exe = shutil.which("unshare")
    if exe is None:
        return None
    prefix = (exe, "-n", "--") if os.geteuid() == 0 else (exe, "-r", "-n", "--")
    try:
        probe = subprocess.run([*prefix, "true"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, timeout=10, start_new_session=True)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return prefix if probe.returncode == 0 else None


def require_network_isolation() -> tuple[str, ...]:
    """The isolation prefix, or SandboxIsolationError: one line saying why and how to opt out."""
    prefix = network_isolation_prefix()
    if prefix is not None:
        return prefix
    if shutil.which("unshare") is None:
        why = "`unshare` is not on PATH"
    elif os.geteuid() == 0:
        why = "`unshare -n` failed"
    else:
        why = f"`unshare -r -n` failed (user namespaces are blocked for uid {os.geteuid()})"
    raise SandboxIsolationError(
        f"the verifier sandbox cannot isolate the network here: {why}; run where it works (as root, or "
        f"with user namespaces allowed), or set network = \"off-unsafe\" in the task's sandbox table "
        f"([task.sandbox] or [task.verifier.sandbox]) to run verifiers WITHOUT network isolation")


class SandboxedWorker:
    """Parent side: serializes requests to one worker process, restarting it after any failure.

    Thread-safe (one request at a time). `factory` is "module:function"; the child imports it and
    calls it once to get the request handler (a `dict -> dict` callable): with no arguments, or with
    `argument` when one is given (which task plugin to load: `hacfed.tasks.plugin`)."""

    def __init__(self, factory: str, limits: SandboxLimits | None = None, argument: str | None = None) -> None:
        if not isinstance(factory, str) or factory.count(":") != 1:
            raise ValueError(f"SandboxedWorker factory must be 'module:function', got {factory!r}")
        if argument is not None and not isinstance(argument, str):
            raise ValueError(f"SandboxedWorker argument must be a string or None, got {argument!r}")
        self.factory = factory
        self.argument = argument
        self.limits = limits if limits is not None else SandboxLimits()
        self._lock = threading.Lock()
        self._proc: _WorkerProcess | None = None
        self._closed = False
        self.starts = 0  # workers started so far; more than one means timeouts, deaths or retirements

    def call(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """Send one request; return the handler's reply or raise SandboxAbort (never hangs past timeout_s)."""
        payload = json.dumps(request, ensure_ascii=True).encode("ascii")
        if len(payload) > MAX_REQUEST_BYTES:
            raise SandboxAbort(f"refused: request of {len(payload)} bytes exceeds {MAX_REQUEST_BYTES}")
        with self._lock:
            if self._closed:
                raise RuntimeError("SandboxedWorker is closed")
            proc = self._ensure_started()
            try:
                reply = proc.roundtrip(payload, self.limits.timeout_s, self.limits.max_reply_bytes)
            except SandboxAbort:
                self._discard()
                raise
            if reply.get("retire"):
                self._discard()
            if not reply.get("ok"):
                raise SandboxAbort(str(reply.get("error", "worker error"))[:200])
            result = reply.get("result")
            if not isinstance(result, dict):
                self._discard()
                raise SandboxAbort("protocol error: malformed reply")
            return result

    def start(self) -> None:
        """Start the worker process now if none runs (else the next `call` starts it), so that the
        time a caller measures around `call` is the request's alone."""
        with self._lock:
            if self._closed:
                raise RuntimeError("SandboxedWorker is closed")
            self._ensure_started()

    @property
    def network_isolated(self) -> bool:
        """Whether the current worker runs with no network interface but loopback (starts one if needed)."""
        with self._lock:
            return self._ensure_started().network_isolated

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.popen.pid

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._discard()

    def __enter__(self) -> "SandboxedWorker":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ensure_started(self) -> "_WorkerProcess":
        if self._proc is None:
            self._proc = _WorkerProcess.start(self.factory, self.limits, self.argument)
            self.starts += 1
        return self._proc

    def _discard(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc = None


class _WorkerProcess:
    """One live child. `terminate` is also registered with weakref.finalize, so it runs at exit."""

    def __init__(self, popen: subprocess.Popen[bytes], workdir: str, network_isolated: bool) -> None:
        self.popen = popen
        self.network_isolated = network_isolated
        self._finalizer = weakref.finalize(self, _terminate, popen, workdir)

    @classmethod
    def start(cls, factory: str, limits: SandboxLimits, argument: str | None = None) -> "_WorkerProcess":
        # Checked again at each start: what held when the limits were built must still hold.
        prefix = require_network_isolation() if limits.network == "required" else ()
        workdir = tempfile.mkdtemp(prefix="hacfed-sandbox-")
        os.chmod(workdir, 0o500)
        package_root = str(Path(__file__).resolve().parents[2])
        config = {"cpu_s_per_item": limits.item_cpu_s, "cpu_s_lifetime": limits.cpu_s_lifetime,
                  "memory_bytes": limits.memory_bytes, "max_processes": limits.max_processes,
                  "self_timeout_s": 0.8 * limits.timeout_s, "factory_argument": argument}
        bootstrap = ("import sys; sys.path.insert(0, sys.argv[1]); "
                     "from hacfed.tasks.sandbox_worker import child_main; child_main(sys.argv[2:])")
        env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8",
               "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        argv = [*prefix, sys.executable, "-I", "-B", "-c", bootstrap, package_root, factory, json.dumps(config)]
        try:
            popen = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     cwd=workdir, env=env, start_new_session=True, bufsize=0)
        except OSError as e:
            shutil.rmtree(workdir, ignore_errors=True)
            raise SandboxStartError(f"cannot start sandbox worker {argv[0]}: {e}") from e
        proc = cls(popen, workdir, network_isolated=False)
        try:
            hello = proc.read_frame(time.monotonic() + limits.startup_timeout_s, limits.max_reply_bytes)
        except SandboxAbort as e:
            proc.terminate()
            raise SandboxStartError(f"sandbox worker for {factory} failed to start: {e.reason}") from None
        if not hello.get("ok"):
            proc.terminate()
            raise SandboxStartError(f"sandbox worker for {factory} failed to start: {hello.get('error')}")
        proc.network_isolated = hello.get("interfaces") == ["lo"]
        if prefix and not proc.network_isolated:
            proc.terminate()
            raise SandboxStartError(f"worker under unshare still sees interfaces {hello.get('interfaces')}")
        return proc

    def roundtrip(self, payload: bytes, timeout_s: float, max_reply: int) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        try:
            write_all(self.popen.stdin.fileno(), FRAME_HEADER.pack(len(payload)) + payload)  # type: ignore[union-attr]
        except (BrokenPipeError, ConnectionResetError):
            raise SandboxAbort(self._death_reason()) from None
        return self.read_frame(deadline, max_reply)

    def read_frame(self, deadline: float, max_bytes: int) -> dict[str, Any]:
        fd = self.popen.stdout.fileno()  # type: ignore[union-attr]
        (length,) = FRAME_HEADER.unpack(self._read_exact(fd, FRAME_HEADER.size, deadline))
        if length > max_bytes:
            raise SandboxAbort(f"protocol error: reply of {length} bytes exceeds {max_bytes}")
        try:
            message = json.loads(self._read_exact(fd, length, deadline))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise SandboxAbort("protocol error: reply is not JSON") from None
        if not isinstance(message, dict):
            raise SandboxAbort("protocol error: reply is not an object")
        return message

    def _read_exact(self, fd: int, n: int, deadline: float) -> bytes:
        chunks: list[bytes] = []
        poller = select.poll()  # not select(): a busy coordinator may hold fds above FD_SETSIZE
        poller.register(fd, select.POLLIN)
        while n > 0:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not poller.poll(math.ceil(remaining * 1000)):
                raise SandboxAbort("timeout")
            chunk = os.read(fd, min(n, 1 << 16))
            if not chunk:
                raise SandboxAbort(self._death_reason())
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def _death_reason(self) -> str:
        """Why the pipe closed. Kills the group first, while the unreaped leader still pins its pid."""
        _kill_group(self.popen)
        try:
            code = self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            return "worker closed its pipe but did not exit"
        if code >= 0:
            return f"worker exited with status {code}"
        try:
            return f"worker killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"worker killed by signal {-code}"

    def terminate(self) -> None:
        self._finalizer()


def _terminate(popen: subprocess.Popen[bytes], workdir: str) -> None:
    """Close the pipes, SIGKILL the worker's process group, reap it, remove its temp dir."""
    for stream in (popen.stdin, popen.stdout):
        if stream is not None:
            stream.close()
    _kill_group(popen)
    try:
        popen.wait(timeout=10)
    except subprocess.TimeoutExpired:
        _log.warning("hacfed sandbox: worker pid %d did not exit 10 s after SIGKILL", popen.pid)
    os.chmod(workdir, 0o700)
    shutil.rmtree(workdir, ignore_errors=True)


def _kill_group(popen: subprocess.Popen[bytes]) -> None:
    """SIGKILL the worker's process group (anything it forked goes too), unless it is already reaped:
    a reaped pid may belong to someone else by now."""
    if popen.returncode is None:
        try:
            os.killpg(popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


_warned_unsafe = False


def _warn_unsafe_once() -> None:
    """Logged, so it reaches stderr even where logging is not configured (Python's last-resort handler)."""
    global _warned_unsafe
    if not _warned_unsafe:
        _warned_unsafe = True
        _log.warning(UNSAFE_WARNING)
