"""Another process fills the coordinator's disk while a round is open (issue 42 H1; security.md H1).

hacfed-server's state dir lies on a 48 MiB tmpfs in a mount namespace this test owns (`unshare -m`,
root only, as in test_superlink_disk_full.py), with the free-space check off
(`server.min_free_mib=0`), so the only thing that notices is a write that fails. One lab; it stops
itself in its first step, after taking in round 0's task and before replying
(`HACFED_STOP_AT=mid_checkpoint`, hacfed.crashpoints), the rest of its tree is stopped too (SIGSTOP),
`dd` fills the disk to its last byte, and the lab is let go: its submission meets a full disk. The
round's deadline passes while the disk is full. Then the file is removed. hacfed-server must:

- print `PAUSED: ...` (hacfed.server.disk_space) and not exit, however many ServerApp runs end;
- print `resumed: ...` once space is back, with the round's deadline held by the time paused;
- take the lab's submission into that same round (from its outbox): a receipt, no ROUND-CLOSED,
  and the round closes by quorum with the lab.

Without the fix hacfed-server never said PAUSED, gave up after `server.max_run_restarts` failed runs
(exit 1), and the round expired: the lab's submission was refused ROUND-CLOSED. Real processes on
loopback.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from hacfed.crashpoints import STOP_ENV
from hacfed.keys import ensure_key_pair
from hacfed.procs import free_port
from tests.federation import coordinator_toml, lab_outbox, read_only
from tests.integration.test_superlink_disk_full import _fill, _in_namespace, tiny_disk  # noqa: F401 - a fixture
from tests.processes import BIN, Proc, cli_env, running_descendants, wait_nothing_left

pytestmark = pytest.mark.slow

DEADLINE_S = 45.0  # the lab and a restarted ServerApp come back well within it after the pause
SERVER_TOML = coordinator_toml("it-disk-filled", rounds=4, prompts_per_round=8, group_size=8, expected_participants=1,
                               min_participants=1, round_deadline_s=DEADLINE_S, max_deadline_extensions=0,
                               eval_every=0, max_new_tokens=12, server={"retry_interval_s": 1.0})


def _received(lab_dir: Path, plan_round: int) -> bool:
    path = lab_outbox(lab_dir)
    if not path.exists():
        return False
    try:
        with read_only(path) as db:
            return db.execute("SELECT 1 FROM received WHERE plan_round=?", (plan_round,)).fetchone() is not None
    except Exception:  # noqa: BLE001 - the lab is creating the file
        return False


def _submitted(lab_dir: Path, round_id: int) -> bool:
    with read_only(lab_outbox(lab_dir)) as db:
        return db.execute("SELECT 1 FROM outbox WHERE round_id=?", (round_id,)).fetchone() is not None


def _signal_tree(proc: Proc, sig: int) -> None:
    root = psutil.Process(proc.popen.pid)
    for p in reversed([root, *root.children(recursive=True)]):
        try:
            p.send_signal(sig)
        except psutil.NoSuchProcess:
            pass


def _held_in_round_0(lab: Proc, lab_dir: Path, server: Proc) -> float:
    """Wait until the lab stopped itself in its first step (HACFED_STOP_AT=mid_checkpoint: it took in
    round 0's task and wrote its submission to its own outbox; its reply is not sent), then stop the rest
    of its tree; returns when (monotonic) the test saw round 0 open (its deadline is earlier than that
    plus DEADLINE_S). Stopping the lab from outside raced with its step, which takes a fraction of a
    second on a quiet machine."""
    opened = server.wait_for(r"round 0 open: ", timeout=300) and time.monotonic()
    lab.wait_for(rf"{STOP_ENV}=mid_checkpoint: stopped at mid_checkpoint", timeout=240)
    _signal_tree(lab, signal.SIGSTOP)
    assert _received(lab_dir, 0) and _submitted(lab_dir, 0), lab.text()[-3000:]
    return opened


def _since(proc: Proc, pattern: str, offset: int, timeout: float) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while True:
        match = re.compile(pattern).search(proc.text(), offset)
        if match:
            return match
        assert proc.popen.poll() is None, f"{proc.name} exited ({proc.popen.returncode}):\n{proc.text()[-5000:]}"
        assert time.monotonic() < deadline, f"{proc.name}: no /{pattern}/ within {timeout}s:\n{proc.text()[-5000:]}"
        time.sleep(0.2)


def test_a_disk_filled_by_another_process_pauses_the_coordinator_and_the_open_round_waits(
        tiny_disk, tmp_path: Path, zoo_presets: Callable[..., None]) -> None:  # noqa: F811 - the fixture
    zoo_presets("tiny-llama")
    holder, mount = tiny_disk
    env = {**cli_env(), "OMP_NUM_THREADS": "1"}
    (tmp_path / "coordinator.toml").write_text(SERVER_TOML)
    server_dir, lab_dir = mount / "server", tmp_path / "lab-a"
    coordinator_pub = ensure_key_pair(tmp_path / "lab-given", "coordinator").public
    address = f"127.0.0.1:{free_port()}"
    before = running_descendants()
    procs: list[Proc] = []
    try:
        subprocess.run(_in_namespace(holder, "sh", "-c", f"mkdir -p {server_dir}/keys && cp -r "
                                     f"{tmp_path}/lab-given/. {server_dir}/", cwd=tmp_path), check=True, timeout=30)
        lab = Proc("lab-a", [str(BIN / "hacfed-client"), "--model", "tiny-llama", "--server", address,
                             "--participant-id", "lab-a", "--state-dir", str(lab_dir),
                             "--coordinator-key", str(coordinator_pub), "--insecure", "--eval-problems", "4"],
                   tmp_path / "lab-a.log", {**env, STOP_ENV: "mid_checkpoint"})
        procs.append(lab)
        while not (lab_dir / "participant.pub").exists():
            assert lab.popen.poll() is None, lab.text()
            time.sleep(0.2)
        subprocess.run(_in_namespace(holder, "cp", str(lab_dir / "participant.pub"), f"{server_dir}/keys/lab-a.pub",
                                     cwd=tmp_path), check=True, timeout=30)
        argv = [str(BIN / "hacfed-server"), "--config", str(tmp_path / "coordinator.toml"), "--insecure",
                "--listen", address, "--state-dir", str(server_dir), "--set", "server.min_free_mib=0"]
        server = Proc("server", _in_namespace(holder, *argv, cwd=tmp_path), tmp_path / "server.log", env)
        procs.append(server)

        round_id, opened = 0, _held_in_round_0(lab, lab_dir, server)
        filled_at = len(server.text())
        _fill(holder, mount)  # another process takes every byte left
        _since(server, r"hacfed-server: PAUSED: a write of \d+ KiB to the state dir .* fails: No space left on device",
               filled_at, timeout=120)
        lab_from = len(lab.text())
        _signal_tree(lab, signal.SIGCONT)  # its submission meets the full disk
        while time.monotonic() < opened + DEADLINE_S + 5:  # the round's deadline passes while the disk is full
            assert server.popen.poll() is None, server.text()[-5000:]
            time.sleep(0.5)

        freed_at = len(server.text())
        subprocess.run(_in_namespace(holder, "rm", "-f", str(mount / "fill"), cwd=tmp_path), check=True, timeout=30)
        resumed = _since(server, r"hacfed-server: resumed: the state dir .* can be written again \(paused (\d+)s\)",
                         freed_at, timeout=120)
        paused_s = int(resumed.group(1))
        assert paused_s >= DEADLINE_S - 10, resumed.group(0)  # filled before the deadline, freed after it
        _since(server, rf"round {round_id}: deadline held \d+s \(the time paused\)", freed_at, timeout=120)
        _since(lab, rf"round {round_id}: receipt seq \d+ \(content [0-9a-f]+\): accepted [1-9]", lab_from, timeout=300)
        _since(server, rf"round {round_id} closed \(quorum\) .*; contributors \['lab-a'\]", freed_at, timeout=120)
        assert "ROUND-CLOSED" not in lab.text()[lab_from:] and "ROUND-CLOSED" not in server.text()
        assert "giving up" not in server.text() and server.popen.poll() is None
        server.stop()
        assert server.popen.returncode == 0, server.text()[-3000:]
    finally:
        for proc in reversed(procs):
            if proc.popen.poll() is None:
                try:
                    _signal_tree(proc, signal.SIGCONT)
                except psutil.NoSuchProcess:
                    pass
            proc.stop()
    wait_nothing_left(before)
