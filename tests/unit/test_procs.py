"""Process supervision: children and grandchildren are gone after stop, whatever happens."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from hacfed.procs import (
    ProcessError,
    ProcessSupervisor,
    flower_env,
    free_port,
    start_process,
    wait_for_log_line,
    wait_for_port,
)

PY = sys.executable

# A child that starts one grandchild in its own group and one that escapes it (setsid),
# prints both pids, then sleeps. `ignore_term` makes the child ignore SIGTERM.
_TREE_SCRIPT = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    if sys.argv[1] == "ignore":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    inner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    escaped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                               start_new_session=True)
    print(f"PIDS {inner.pid} {escaped.pid}", flush=True)
    time.sleep(60)
    """
)


def _running(pid: int) -> bool:
    """A zombie counts as gone: it runs nothing (some containers' PID 1 never reaps)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _start_tree(sup: ProcessSupervisor, tmp_path: Path, mode: str = "plain") -> tuple[int, int, int]:
    log = tmp_path / f"tree-{mode}.log"
    proc = sup.start([PY, "-c", _TREE_SCRIPT, mode], env=dict(os.environ), log_path=log, name="tree")
    match = wait_for_log_line(log, r"PIDS (\d+) (\d+)", timeout=20, process=proc)
    return proc.pid, int(match.group(1)), int(match.group(2))


def test_stop_kills_child_grandchild_and_escaped_grandchild(tmp_path: Path) -> None:
    with ProcessSupervisor(grace_s=2.0) as sup:
        pids = _start_tree(sup, tmp_path)
        assert all(_running(p) for p in pids)
        proc = sup.processes[0]
        assert os.getpgid(proc.pid) == proc.pid  # leader of its own group
        sup.stop(proc)
        assert not any(_running(p) for p in pids)
        assert sup.processes == ()


def test_sigterm_ignoring_child_is_killed_after_grace(tmp_path: Path) -> None:
    with ProcessSupervisor(grace_s=0.3) as sup:
        pids = _start_tree(sup, tmp_path, mode="ignore")
        code = sup.stop(sup.processes[0])
    assert code == -signal.SIGKILL
    assert not any(_running(p) for p in pids)


def test_exception_inside_context_leaves_nothing(tmp_path: Path) -> None:
    pids: tuple[int, int, int] = (0, 0, 0)
    with pytest.raises(RuntimeError, match="boom"):
        with ProcessSupervisor(grace_s=2.0) as sup:
            pids = _start_tree(sup, tmp_path)
            raise RuntimeError("boom")
    assert pids[0] > 0
    assert not any(_running(p) for p in pids)


def test_keyboard_interrupt_inside_context_leaves_nothing(tmp_path: Path) -> None:
    pids: tuple[int, int, int] = (0, 0, 0)
    with pytest.raises(KeyboardInterrupt):
        with ProcessSupervisor(grace_s=2.0) as sup:
            pids = _start_tree(sup, tmp_path)
            raise KeyboardInterrupt
    assert pids[0] > 0
    assert not any(_running(p) for p in pids)


_SUPERVISED_PARENT = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from hacfed.procs import ProcessSupervisor
    log = Path(sys.argv[1])
    with ProcessSupervisor(grace_s=2.0) as sup:
        child = sup.start([sys.executable, "-c", "import time; time.sleep(60)"],
                          env=dict(os.environ), log_path=log, name="sleeper")
        print(f"CHILD {child.pid}", flush=True)
        time.sleep(60)
    """
)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_signal_to_supervising_process_stops_its_children(tmp_path: Path, sig: signal.Signals) -> None:
    parent = subprocess.Popen(
        [PY, "-c", _SUPERVISED_PARENT, str(tmp_path / "child.log")],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline()
        child_pid = int(line.split()[1])
        assert _running(child_pid)
        parent.send_signal(sig)
        assert parent.wait(timeout=20) == 128 + sig
        assert not _running(child_pid)
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
            parent.wait()


def test_wait_for_log_line_fails_fast_when_process_exits(tmp_path: Path) -> None:
    log = tmp_path / "dies.log"
    proc = start_process([PY, "-c", "print('starting'); raise SystemExit(3)"], env=dict(os.environ),
                         log_path=log, name="dies")
    try:
        with pytest.raises(ProcessError, match=r"dies .*exited with code 3"):
            wait_for_log_line(log, r"never printed", timeout=30, process=proc)
    finally:
        proc.stop(1.0)


def test_wait_for_port_and_free_port(tmp_path: Path) -> None:
    port = free_port()
    server = (
        "import socket, time\n"
        f"s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen(); print('up', flush=True)\n"
        "time.sleep(60)\n"
    )
    with ProcessSupervisor(grace_s=1.0) as sup:
        proc = sup.start([PY, "-c", server], env=dict(os.environ), log_path=tmp_path / "srv.log", name="srv")
        wait_for_port("127.0.0.1", port, timeout=20, process=proc)
    with pytest.raises(TimeoutError, match=str(port)):
        wait_for_port("127.0.0.1", port, timeout=0.3)


def test_flower_env_isolates_home_and_disables_phoning_home(tmp_path: Path) -> None:
    env = flower_env(tmp_path / "home", base={"PATH": "/usr/bin", "KEEP": "1"})
    assert env["FLWR_HOME"] == str(tmp_path / "home")
    assert (tmp_path / "home").is_dir()
    assert env["FLWR_TELEMETRY_ENABLED"] == "0"
    assert env["FLWR_DISABLE_UPDATE_CHECK"] == "1"
    assert env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] == "1"
    assert env["PATH"].split(os.pathsep)[0] == str(Path(PY).parent)
    assert env["KEEP"] == "1"


def test_start_process_rejects_empty_argv(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="empty"):
        start_process([], env={}, log_path=tmp_path / "x.log", name="nothing")


def test_well_behaved_child_ends_on_sigterm_not_sigkill(tmp_path: Path) -> None:
    with ProcessSupervisor(grace_s=5.0) as sup:
        proc = sup.start([PY, "-c", "import time; time.sleep(60)"], env=dict(os.environ),
                         log_path=tmp_path / "s.log", name="s")
        code = sup.stop(proc)
    assert code == -signal.SIGTERM


def test_wait_for_log_line_ignores_what_an_earlier_run_left_in_the_log(tmp_path: Path) -> None:
    log = tmp_path / "shared.log"
    log.write_text("Starting Fleet API on 127.0.0.1:1111\n")  # from a previous start
    proc = start_process([PY, "-c", "print('Starting Fleet API on 127.0.0.1:2222')"], env=dict(os.environ),
                         log_path=log, name="second")
    try:
        match = wait_for_log_line(log, r"Starting Fleet API on (\S+)", timeout=30, process=proc)
        assert match.group(1) == "127.0.0.1:2222"
        with pytest.raises(ProcessError, match="second"):
            wait_for_log_line(log, r":1111", timeout=30, process=proc)
    finally:
        proc.stop(1.0)
