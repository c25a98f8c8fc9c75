"""A port something already listens on (hacfed-server's Fleet API or dashboard, hacfed demo's dashboard)
is refused in one line before any process starts or any file is written: no half-made state dir, no
SuperLink traceback, no "cannot listen on ...: 3"."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hacfed.config_values import check_port_free

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def _run(argv: list[str], cwd: Path, timeout_s: float = 120.0) -> subprocess.CompletedProcess:
    """A child in its own process group, ended by its pid if it outlives the timeout (then the test fails)."""
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"{argv[0]} was still running after {timeout_s:.0f} s instead of refusing the port")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def test_check_port_free_names_the_flag_and_port(busy_port):
    with pytest.raises(ValueError, match=f"--listen: port {busy_port} on 127.0.0.1 is in use"):
        check_port_free("127.0.0.1", busy_port, "--listen")
    check_port_free("127.0.0.1", 0, "--listen")  # the OS picks


def test_a_free_port_passes():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    check_port_free("127.0.0.1", port, "--listen")


@pytest.mark.parametrize("flag", ["--listen", "--dashboard"])
def test_hacfed_server_refuses_a_busy_port_before_writing(flag, busy_port, tmp_path):
    state = tmp_path / "state"
    listen = f"127.0.0.1:{busy_port}" if flag == "--listen" else "127.0.0.1:0"
    extra = ["--dashboard", f"127.0.0.1:{busy_port}"] if flag == "--dashboard" else []
    done = _run([str(BIN / "hacfed-server"), "--config", str(REPO / "deploy" / "coordinator.toml"), "--insecure",
                 "--listen", listen, "--state-dir", str(state), *extra], tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr == f"hacfed-server: error: {flag}: port {busy_port} on 127.0.0.1 is in use (another " \
                          "hacfed-server or another program listens there); stop it or choose another port\n"
    assert done.stdout == ""
    assert not state.exists()


def test_hacfed_demo_refuses_a_busy_dashboard_port_before_starting(busy_port, tmp_path):
    done = _run([str(BIN / "hacfed"), "demo", "--dashboard", f"127.0.0.1:{busy_port}", "--rounds", "1",
                 "--state-dir", str(tmp_path / "demo"), "--metrics-out", str(tmp_path / "m.jsonl")], tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"--dashboard: port {busy_port} on 127.0.0.1 is in use" in done.stderr
    assert len(done.stderr.splitlines()) == 1 and done.stdout == "", done.stdout + done.stderr
    assert not (tmp_path / "demo").exists()


def test_the_dashboard_server_says_the_port_is_in_use(busy_port, tmp_path):
    """A port taken between the check and the bind: the reason, not uvicorn's exit code."""
    from hacfed.server.dashboard.bind import DashboardAddress
    from hacfed.server.dashboard.reader import DashboardSources
    from hacfed.server.dashboard.serve import start_dashboard

    sources = DashboardSources(journal=tmp_path / "j.sqlite", metrics=tmp_path / "m.jsonl", keys_dir=tmp_path,
                               status=tmp_path / "s.json", run_id="r", rounds=1, round_deadline_s=10.0)
    with pytest.raises(ValueError) as info:
        start_dashboard(DashboardAddress("127.0.0.1", busy_port, False), sources)
    assert str(info.value) == f"--dashboard: cannot listen on 127.0.0.1:{busy_port} (is the port in use?)"


def test_a_port_a_killed_leftover_releases_a_moment_later_is_waited_for() -> None:
    # kill -9 of hacfed-server, then a restart: it stops the leftover SuperLink, whose listening
    # socket the kernel releases a moment later. The restart waits for it; a fresh start does not.
    import threading
    from types import SimpleNamespace

    from hacfed.server.runner import check_ports

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    cfg = SimpleNamespace(listen=("127.0.0.1", holder.getsockname()[1]), dashboard_address=None)
    with pytest.raises(ValueError, match="is in use"):
        check_ports(cfg)  # type: ignore[arg-type]
    timer = threading.Timer(0.5, holder.close)
    timer.start()
    try:
        check_ports(cfg, settle_s=30.0)  # type: ignore[arg-type]
    finally:
        timer.cancel()
        holder.close()
