"""The sandbox's own limits, tested with a handler that *does* run hostile code (security.md S8).

The math-verify worker never executes model text; these tests show what still holds if it did:
wall timeout and restart, CPU and memory limits, no file content written, no network, no fork
(for non-root users; the kernel exempts uid 0 from RLIMIT_NPROC), and no worker left behind.
The child imports this module to get `hostile_handler`.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from hacfed.tasks import sandbox
from hacfed.tasks.math_verifier import MathVerifier, MathVerifierConfig
from hacfed.tasks.sandbox import VERIFIER_ABORT, SandboxAbort, SandboxedWorker, SandboxLimits, network_isolation_prefix

pytestmark = pytest.mark.slow

HANDLER = "tests.integration.test_sandbox_hostile:hostile_handler"


def hostile_handler() -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Runs in the sandboxed child only."""

    def handle(request: dict[str, Any]) -> dict[str, Any]:
        action = request["action"]
        if action == "echo":
            return {"echo": request["value"]}
        if action == "spin":
            while True:
                pass
        if action in ("hang", "burn"):
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})  # ignore the child's own timer
            if action == "hang":
                time.sleep(3600)
            while True:
                pass
        if action == "alloc":
            return {"bytes": len(bytearray(8 << 30))}
        if action == "connect":
            try:
                socket.create_connection(("127.0.0.1", request["port"]), timeout=1).close()
            except OSError as e:
                return {"connected": False, "errno": e.errno}
            return {"connected": True}
        if action == "write":
            try:
                with open(request["path"], "wb") as f:
                    f.write(b"x" * 4096)
                    f.flush()
            except OSError as e:
                return {"wrote": False, "errno": e.errno}
            return {"wrote": True}
        if action == "fork":
            try:
                pid = os.fork()
            except OSError as e:
                return {"forked": False, "errno": e.errno}
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)
            return {"forked": True}
        raise ValueError(f"unknown action {action}")

    return handle


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture
def worker() -> Iterator[SandboxedWorker]:
    with SandboxedWorker(HANDLER, SandboxLimits(timeout_s=1.0)) as w:
        yield w


def test_unresponsive_worker_is_killed_at_the_wall_timeout_and_replaced(worker: SandboxedWorker) -> None:
    assert worker.call({"action": "echo", "value": 1}) == {"echo": 1}
    first = worker.pid
    assert first is not None
    started = time.monotonic()
    with pytest.raises(SandboxAbort, match="^timeout$"):
        worker.call({"action": "hang"})
    assert time.monotonic() - started <= 1.0 + 1.0  # S8: never past timeout + 1 s
    assert _gone(first)
    assert worker.call({"action": "echo", "value": 2}) == {"echo": 2}
    assert worker.starts == 2 and worker.pid != first


def test_busy_loop_is_interrupted_inside_the_worker_which_survives(worker: SandboxedWorker) -> None:
    worker.call({"action": "echo", "value": 0})
    pid = worker.pid
    with pytest.raises(SandboxAbort, match="^timeout$"):
        worker.call({"action": "spin"})
    assert worker.call({"action": "echo", "value": 3}) == {"echo": 3}
    assert worker.pid == pid and worker.starts == 1


def test_cpu_limit_kills_a_worker_that_ignores_its_timer() -> None:
    # Wall timeout far away so only RLIMIT_CPU (1 s per item beyond start-up) can stop it.
    with SandboxedWorker(HANDLER, SandboxLimits(timeout_s=30.0, cpu_s_per_item=1)) as worker:
        with pytest.raises(SandboxAbort, match="SIGXCPU|SIGKILL"):
            worker.call({"action": "burn"})
        assert worker.call({"action": "echo", "value": 4}) == {"echo": 4}
        assert worker.starts == 2


def test_memory_limit_turns_a_huge_allocation_into_memory_error(worker: SandboxedWorker) -> None:
    with pytest.raises(SandboxAbort, match="^MemoryError$"):
        worker.call({"action": "alloc"})
    assert worker.call({"action": "echo", "value": 5}) == {"echo": 5}
    assert worker.starts == 2  # retired after MemoryError


def test_no_file_content_can_be_written(worker: SandboxedWorker, tmp_path: Path) -> None:
    target = tmp_path / "outside.bin"
    assert worker.call({"action": "write", "path": str(target)}) == {"wrote": False, "errno": errno.EFBIG}
    # RLIMIT_FSIZE 0 stops any byte; creating an empty file is not prevented for code that runs.
    assert not target.exists() or target.stat().st_size == 0


@pytest.mark.skipif(network_isolation_prefix() is None, reason="`unshare -n` unavailable on this machine")
def test_no_network_connection_reaches_a_host_loopback_canary(worker: SandboxedWorker) -> None:
    with socket.socket() as canary:
        canary.bind(("127.0.0.1", 0))
        canary.listen(8)
        canary.setblocking(False)
        reply = worker.call({"action": "connect", "port": canary.getsockname()[1]})
        assert reply["connected"] is False and reply["errno"] in (errno.ENETUNREACH, errno.ECONNREFUSED)
        with pytest.raises(BlockingIOError):
            canary.accept()  # the canary saw no connection
    assert worker.network_isolated


@pytest.mark.skipif(os.geteuid() == 0, reason="the kernel does not enforce RLIMIT_NPROC for uid 0")
def test_fork_is_refused(worker: SandboxedWorker) -> None:
    assert worker.call({"action": "fork"}) == {"forked": False, "errno": errno.EAGAIN}


def test_math_verifier_hostile_corpus_within_timeout_plus_one_second(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    timeout_s = 3.0
    corpus = [
        "\\boxed{__import__('os').system('touch X')}",
        "\\boxed{9^{9^{9^{9}}}}",
        "\\boxed{10^{10^{10^{10}}}!}",
        "\\boxed{" + "{" * 8 + "1" + "}" * 8 + "}",
        "\\boxed{\\sum_{n=1}^{10^{100}} n^{n}}",
        "\\boxed{" + "(" * 100 + "1" + ")" * 100 + "}",
        "\\boxed{x}" + "\x00" * 10,
        "\\boxed{\udcff}",
        "y" * (1 << 20),
    ]
    with MathVerifier(MathVerifierConfig(sandbox=SandboxLimits(timeout_s=timeout_s))) as verifier:
        assert verifier.verify("2", "\\boxed{1+1}").reward == 1.0  # start the worker outside the timed items
        for response in corpus:
            started = time.monotonic()
            verdict = verifier.verify("72", response)
            assert time.monotonic() - started <= timeout_s + 1.0, response[:40]
            assert verdict.reward == 0.0 and verdict.reason, (response[:40], verdict)
        assert verifier.verify("0.5", "\\boxed{\\frac{1}{2}}").reward == 1.0
    assert list(tmp_path.iterdir()) == []


def test_missing_netns_is_refused_unless_opted_out_and_close_reaps_the_worker(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sandbox, "network_isolation_prefix", lambda: None)
    monkeypatch.setattr(sandbox, "_warned_unsafe", False)
    with pytest.raises(sandbox.SandboxIsolationError, match="off-unsafe"):
        SandboxLimits(timeout_s=2.0)
    with caplog.at_level(logging.WARNING, logger="hacfed.tasks.sandbox"):
        worker = SandboxedWorker(HANDLER, SandboxLimits(timeout_s=2.0, network="off-unsafe"))
        assert worker.call({"action": "echo", "value": 6}) == {"echo": 6}
    assert "WITHOUT network isolation" in caplog.text
    pid = worker.pid
    assert pid is not None
    worker.close()
    assert worker.pid is None and _gone(pid)  # killed and reaped
    with pytest.raises(RuntimeError, match="closed"):
        worker.call({"action": "echo", "value": 7})


def test_a_busy_worker_is_killed_at_interpreter_exit_without_close() -> None:
    # The worker hangs (not reading its pipe), so only the exit-time finalizer can stop it.
    script = textwrap.dedent(f"""
        import threading, time
        from hacfed.tasks.sandbox import SandboxedWorker, SandboxLimits
        w = SandboxedWorker({HANDLER!r}, SandboxLimits(timeout_s=60.0))
        w.call({{"action": "echo", "value": 0}})
        threading.Thread(target=w.call, args=({{"action": "hang"}},), daemon=True).start()
        time.sleep(0.5)
        print(w.pid, flush=True)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr[-2000:]
    pid = int(out.stdout.strip())
    deadline = time.monotonic() + 10
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if not _gone(pid):
        os.kill(pid, signal.SIGKILL)  # leave nothing running, then fail
        pytest.fail(f"worker {pid} outlived its parent")


def test_abort_code_is_the_closed_enum_value() -> None:
    assert VERIFIER_ABORT == "HACFED-E-VERIFIER-ABORT"
