"""hacfed-server's process plumbing: leftovers of a SIGKILLed server, the console tail, the state lock."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hacfed.leftovers import CHILDREN_FILE, kill_leftovers, record_children
from hacfed.server.config import load_server_config
from hacfed.server.driver_settings import parse_supervisor, process_start_ticks, supervisor_alive
from hacfed.server.runner import ConsoleTail, lock_state_dir, run_config
from tests.unit.test_coordinator_fakes import FakeClock
from tests.unit.test_server_config import BASE
from tests.unit.test_server_driver import Federation


def _sleeper(ignore_term: bool = False) -> subprocess.Popen:
    code = "import signal, sys, time\n"
    if ignore_term:
        code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    code += "print('ready', flush=True)\ntime.sleep(60)\n"
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True, stdout=subprocess.PIPE)
    assert proc.stdout.readline() == b"ready\n"  # its SIGTERM handler is in place
    return proc


def test_leftover_children_are_stopped_by_pid_and_start_time(tmp_path: Path) -> None:
    polite, stubborn, innocent = _sleeper(), _sleeper(ignore_term=True), _sleeper()
    try:
        record_children(tmp_path, [("supernode", polite.pid), ("superlink", stubborn.pid)])
        entries = json.loads((tmp_path / CHILDREN_FILE).read_text())
        entries.append({"name": "recycled", "pid": innocent.pid, "start_ticks": process_start_ticks(innocent.pid) + 1})
        (tmp_path / CHILDREN_FILE).write_text(json.dumps(entries))
        stopped = kill_leftovers(tmp_path, grace_s=0.5)
        assert stopped == [f"supernode (pid {polite.pid})", f"superlink (pid {stubborn.pid})"]
        assert polite.wait(timeout=10) == -15  # SIGTERM first: a SuperNode can unregister
        assert stubborn.wait(timeout=10) == -9  # SIGKILL after the grace
        assert innocent.poll() is None  # same pid, other start time: not ours, left alone
        assert not (tmp_path / CHILDREN_FILE).exists() and kill_leftovers(tmp_path) == []
    finally:
        for proc in (polite, stubborn, innocent):
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def test_console_tail_prints_new_complete_lines_only(tmp_path: Path) -> None:
    path = tmp_path / "console.log"
    path.write_text("old line\n")
    seen: list[str] = []
    tail = ConsoleTail(path, seen.append)
    with path.open("a") as fh:
        fh.write("round 0 open\nround 0 cl")
    tail.pump()
    with path.open("a") as fh:
        fh.write("osed\n")
    tail.pump()
    assert [line.split("] ", 1)[1] for line in seen] == ["round 0 open", "round 0 closed"]


def test_one_server_per_state_dir(tmp_path: Path) -> None:
    first = lock_state_dir(tmp_path)
    try:
        with pytest.raises(ValueError, match="another hacfed-server is running with state dir"):
            lock_state_dir(tmp_path)
    finally:
        first.close()
    lock_state_dir(tmp_path).close()


def test_run_config_keeps_the_relay_inside_the_round(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(BASE.format(state=tmp_path / "s"))
    config = run_config(load_server_config(path), tmp_path / "s" / "driver-settings.json")
    assert config["driver"] == "hacfed.server.driver:make_driver"
    assert config["relay-timeout-s"] < load_server_config(path).coordinator.round_deadline_s == 30.0
    assert config["supervisor"] == f"{os.getpid()}:{process_start_ticks(os.getpid())}"


def test_orphaned_driver_stops_when_its_server_is_gone(tmp_path: Path) -> None:
    from hacfed.server.driver import SupervisorGone

    fed = Federation(tmp_path, FakeClock())
    fed.add(1, "lab-a")
    alive = parse_supervisor(f"{os.getpid()}:{process_start_ticks(os.getpid())}")
    assert alive is not None and supervisor_alive(alive)
    fed.supervisor = (os.getpid(), alive[1] + 1)
    fed.driver = fed.new_driver()
    with pytest.raises(SupervisorGone):
        fed.driver.next_round({1: "lab-a"})
