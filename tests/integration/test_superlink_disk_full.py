"""A lab comes back by itself after the coordinator's disk was full (issue 31, item 3).

The coordinator's files lie on a tmpfs mounted in a mount namespace this test owns (`unshare -m`,
root only). Filling the tmpfs makes the SuperLink's SQLite fail ("database or disk is full"), so the
Fleet API answers with UNKNOWN.

- A SuperNode and a SuperLink alone: the SuperNode's heartbeat is its only call that writes. Flower's
  heartbeat thread does not retry UNKNOWN and dies while the main loop pulls on, a node the SuperLink
  counts offline for good (the SuperNode would never rejoin). hacfed's SuperNode exits with
  HEARTBEAT_LOST_EXIT and a line naming the reason, on which hacfed-client restarts it; once space is
  freed and the SuperLink restarted, a new SuperNode registers. Fails without the fix.
- hacfed-server and hacfed-client, the operator's scenario: the disk fills during a run, space is
  freed, hacfed-server restarted; the lab joins again with nobody restarting it. Which of its calls
  fails first depends on timing, so this one covers the recovery, not that particular path.
Real processes on loopback.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hacfed.clients.supernode import HEARTBEAT_LOST_EXIT, HEARTBEAT_LOST_LINE, heartbeat_lost_reason, start_supernode
from hacfed.keys import ensure_key_pair
from hacfed.procs import ProcessSupervisor, flower_env, free_port, wait_for_log_line
from hacfed.server.superlink import superlink_argv
from tests.federation import coordinator_toml
from tests.processes import BIN, Proc, cli_env, running_descendants, wait_nothing_left

pytestmark = pytest.mark.slow

TMPFS_BYTES = 48 * 1024 * 1024
HEARTBEAT_WAIT_S = 120.0  # flwr sends one every ~20 s; the loaded machine gets headroom


def _can_mount() -> bool:
    return os.geteuid() == 0 and shutil.which("unshare") is not None and shutil.which("nsenter") is not None


@pytest.fixture
def tiny_disk(tmp_path: Path):
    """(holder pid, mount point): a process holding a mount namespace with a tmpfs at the mount point."""
    if not _can_mount():
        pytest.skip("needs root, unshare and nsenter (a test-owned mount namespace)")
    mount = tmp_path / "disk"
    mount.mkdir()
    holder = subprocess.Popen(
        ["unshare", "-m", "--propagation", "private", "sh", "-c",
         f"mount -t tmpfs -o size={TMPFS_BYTES} tmpfs {mount} && echo mounted && exec sleep 3600"],
        stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        if holder.stdout.readline().strip() != "mounted":
            pytest.skip("mounting a tmpfs in a new mount namespace is not allowed here")
        yield holder.pid, mount
    finally:
        holder.kill()
        holder.wait(10)


def _in_namespace(pid: int, *argv: str, cwd: Path) -> list[str]:
    # entering a mount namespace moves the working directory to its root: keep it in the test's
    return ["nsenter", "-t", str(pid), "-m", f"--wd={cwd}", "--", *argv]


def _start_superlink(sup: ProcessSupervisor, holder: int, mount: Path, state: Path, fleet_port: int):
    argv = superlink_argv(host="127.0.0.1", fleet_port=fleet_port, control_port=0, serverappio_port=0, tls=None,
                          database=mount / "superlink.db")
    log = state / "superlink.log"
    proc = sup.start(_in_namespace(holder, *argv, cwd=state), env=flower_env(state / "flwr-home"), log_path=log,
                     name="superlink", cwd=state)
    wait_for_log_line(log, r"Starting Fleet API\b.* on (\S+)$", 60.0, process=proc)
    return proc


def _fill(holder: int, mount: Path) -> None:
    subprocess.run(_in_namespace(holder, "sh", "-c", f"dd if=/dev/zero of={mount}/fill bs=64k 2>/dev/null; sync",
                                 cwd=mount),
                   check=False, timeout=60)


def _wait_for_exit(proc, timeout_s: float) -> int | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.alive():
        time.sleep(0.5)
    return proc.returncode()


def test_a_supernode_whose_heartbeat_fails_on_a_full_disk_exits_and_a_new_one_rejoins(tiny_disk, tmp_path: Path):
    holder, mount = tiny_disk
    state = tmp_path / "coordinator"
    state.mkdir()
    fleet_port = free_port()
    node_config = {"participant-id": "lab-a", "participant-address": "127.0.0.1:1"}
    with ProcessSupervisor(handle_signals=False) as sup:
        link = _start_superlink(sup, holder, mount, state, fleet_port)
        node = start_supernode(sup, tmp_path / "lab-a", superlink_address=f"127.0.0.1:{fleet_port}",
                               node_config=node_config)
        _fill(holder, mount)
        code = _wait_for_exit(node.process, HEARTBEAT_WAIT_S)
        log = node.process.log_tail(20_000)
        assert code == HEARTBEAT_LOST_EXIT, f"SuperNode still running or exited otherwise ({code}):\n{log[-3000:]}"
        reason = heartbeat_lost_reason(node.process.log_path)
        assert reason.startswith(HEARTBEAT_LOST_LINE.removeprefix("hacfed: ")) and "UNKNOWN" in reason, reason

        # the operator frees space and restarts the coordinator; the lab's new SuperNode registers
        subprocess.run(_in_namespace(holder, "rm", "-f", str(mount / "fill"), cwd=mount), check=True, timeout=30)
        sup.stop(link)
        _start_superlink(sup, holder, mount, state, fleet_port)
        again = start_supernode(sup, tmp_path / "lab-a", superlink_address=f"127.0.0.1:{fleet_port}",
                                node_config=node_config)
        assert again.node_id > 0 and again.process.alive()


SERVER_TOML = coordinator_toml("it-disk-full", rounds=20, expected_participants=1, min_participants=1,
                               round_deadline_s=600)


def test_hacfed_client_rejoins_a_coordinator_restarted_after_its_disk_was_full(
        tiny_disk, tmp_path: Path, zoo_presets: Callable[..., None]) -> None:
    """The issue's scenario end to end: hacfed-server's state dir on the tiny disk, the disk fills,
    space is freed and hacfed-server restarted; the lab rejoins without anyone restarting it."""
    zoo_presets("tiny-llama")
    holder, mount = tiny_disk
    env = cli_env()
    (tmp_path / "coordinator.toml").write_text(SERVER_TOML)
    server_dir = mount / "server"
    lab_dir = tmp_path / "lab-a"
    coordinator_pub = ensure_key_pair(tmp_path / "lab-given", "coordinator").public
    address = f"127.0.0.1:{free_port()}"

    def server(log: str) -> Proc:
        argv = [str(BIN / "hacfed-server"), "--config", str(tmp_path / "coordinator.toml"), "--insecure",
                "--listen", address, "--state-dir", str(server_dir),
                "--set", "server.min_free_mib=0"]  # the whole tiny disk is below the headroom: fill it anyway
        return Proc("server", _in_namespace(holder, *argv, cwd=tmp_path), tmp_path / log, env)

    before = running_descendants()
    procs: list[Proc] = []
    try:
        # the coordinator's key pair and the lab's registration live on the tiny disk
        subprocess.run(_in_namespace(holder, "sh", "-c", f"mkdir -p {server_dir}/keys && cp -r "
                                     f"{tmp_path}/lab-given/. {server_dir}/", cwd=tmp_path), check=True, timeout=30)
        client = Proc("lab-a", [str(BIN / "hacfed-client"), "--model", "tiny-llama", "--server", address,
                                "--participant-id", "lab-a", "--state-dir", str(lab_dir),
                                "--coordinator-key", str(coordinator_pub), "--insecure", "--eval-problems", "4"],
                      tmp_path / "lab-a.log", env)
        procs.append(client)
        while not (lab_dir / "participant.pub").exists():
            assert client.popen.poll() is None, client.text()
            time.sleep(0.5)
        subprocess.run(_in_namespace(holder, "cp", str(lab_dir / "participant.pub"), f"{server_dir}/keys/lab-a.pub",
                                     cwd=tmp_path), check=True, timeout=30)
        first = server("server-1.log")
        procs.append(first)
        first.wait_for(r"joined: lab-a", timeout=300)

        _fill(holder, mount)
        # Which of the lab's calls fails first depends on timing: its heartbeat (then its SuperNode
        # exits with HEARTBEAT_LOST_EXIT), or a pull (Flower restarts its loop), or the ServerApp's
        # (hacfed-server gives up and stops the SuperLink). Every path must end with the lab back.
        client.wait_for(r"heartbeat to the coordinator stopped|SuperNode exited|coordinator is unreachable",
                        timeout=HEARTBEAT_WAIT_S)

        subprocess.run(_in_namespace(holder, "rm", "-f", str(mount / "fill"), cwd=tmp_path), check=True, timeout=30)
        first.stop()
        second = server("server-2.log")
        procs.append(second)
        second.wait_for(r"joined: lab-a", timeout=300)
    finally:
        for proc in reversed(procs):
            proc.stop()
    wait_nothing_left(before)
