"""A lab whose coordinator is down says so and shows every reconnect attempt (issue 9, item 8; R5).

hacfed-client starts while nothing listens at its --server address: its SuperNode retries with
hacfed's backoff (1 s x1.6, jitter, at most 30 s) and the client prints each failed attempt. Then
hacfed-server starts on that address: the client prints that it is connected again. Real processes
on loopback; the longer outage with outbox checks belongs to the fault suite (tests/faults/).
"""

from __future__ import annotations

import re
import shutil
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from hacfed.keys import ensure_key_pair
from tests.integration.test_federation_flower import BIN, REPO, Proc, _running_descendants, wait_nothing_left

SERVER_TOML = """
run_id = "it-reconnect"
rounds = 1
prompts_per_round = 2
group_size = 2
expected_participants = 1
min_participants = 1
round_deadline_s = 120
state_dir = "server"
[task]
kind = "arithmetic"
digits = 2
operators = "+"
[sampling]
max_new_tokens = 6
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_client_prints_a_down_coordinator_and_its_reconnect_attempts(tmp_path: Path,
                                                                     zoo_presets: Callable[..., None]) -> None:
    zoo_presets("tiny-llama")
    import os

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.setdefault("HACFED_HOME", str(REPO / ".hacfed-home"))
    (tmp_path / "coordinator.toml").write_text(SERVER_TOML)
    server_dir = tmp_path / "server"
    coordinator_pub = ensure_key_pair(server_dir, "coordinator").public  # the key the lab was given
    address = f"127.0.0.1:{_free_port()}"
    before = _running_descendants()
    procs: list[Proc] = []
    try:
        client = Proc("lab-a", [str(BIN / "hacfed-client"), "--model", "tiny-llama", "--server", address,
                                "--participant-id", "lab-a", "--state-dir", str(tmp_path / "lab-a"),
                                "--coordinator-key", str(coordinator_pub), "--insecure", "--eval-problems", "10"],
                      tmp_path / "lab-a.log", env)
        procs.append(client)
        client.wait_for(r"attempt 3 failed", timeout=300)
        waits = [float(x) for x in re.findall(r"attempt \d+ failed, next attempt in ([\d.]+)s", client.text())]
        assert len(waits) >= 3 and waits[0] <= 1.2 and waits[2] > waits[0]  # 1 s, x1.6 each, jittered
        assert "the coordinator is unreachable (UNAVAILABLE); attempt 1 failed" in client.text()
        (server_dir / "keys").mkdir(parents=True, exist_ok=True)
        shutil.copy(tmp_path / "lab-a" / "participant.pub", server_dir / "keys" / "lab-a.pub")
        server = Proc("server", [str(BIN / "hacfed-server"), "--config", str(tmp_path / "coordinator.toml"),
                                 "--insecure", "--listen", address, "--state-dir", str(server_dir)],
                      tmp_path / "server.log", env)
        procs.append(server)
        server.wait_for(r"ready: Fleet API on")
        client.wait_for(r"connected to the coordinator again after \d+ attempts", timeout=120)
        client.wait_for(rf"connected to {re.escape(address)} as lab-a", timeout=120)
        server.wait_for(r"joined: lab-a", timeout=120)
    finally:
        for proc in reversed(procs):
            proc.stop()
    wait_nothing_left(before)
