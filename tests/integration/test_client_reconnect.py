"""A lab whose coordinator is down says so and shows every reconnect attempt (issue 9, item 8; R5).

hacfed-client starts while nothing listens at its --server address: its SuperNode retries with
hacfed's backoff (1 s x1.6, jitter, at most 30 s) and the client prints each failed attempt. Then
hacfed-server starts on that address: the client prints that it is connected again. Real processes
on loopback; the longer outage with outbox checks belongs to the fault suite (tests/faults/).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from hacfed.keys import ensure_key_pair
from hacfed.procs import free_port
from tests.federation import Federation, coordinator_toml
from tests.processes import running_descendants, wait_nothing_left


@pytest.mark.slow
def test_client_prints_a_down_coordinator_and_its_reconnect_attempts(tmp_path: Path,
                                                                     zoo_presets: Callable[..., None]) -> None:
    zoo_presets("tiny-llama")
    fed = Federation(tmp_path)
    fed.configure(coordinator_toml("it-reconnect", rounds=1, expected_participants=1, min_participants=1))
    ensure_key_pair(fed.server_dir, "coordinator")  # the key the lab was given
    (fed.server_dir / "keys").mkdir(parents=True, exist_ok=True)
    fed.address = f"127.0.0.1:{free_port()}"
    before = running_descendants()
    try:
        client = fed.lab("lab-a", extra=("--eval-problems", "10"))  # registered as soon as its key exists
        client.wait_for(r"attempt 3 failed", timeout=300)
        waits = [float(x) for x in re.findall(r"attempt \d+ failed, next attempt in ([\d.]+)s", client.text())]
        assert len(waits) >= 3 and waits[0] <= 1.2 and waits[2] > waits[0]  # 1 s, x1.6 each, jittered
        assert "the coordinator is unreachable (UNAVAILABLE); attempt 1 failed" in client.text()
        server = fed.server("server.log", wait=False)
        server.wait_for(r"ready: Fleet API on")
        client.wait_for(r"connected to the coordinator again after \d+ attempts", timeout=120)
        client.wait_for(rf"connected to {re.escape(fed.address)} as lab-a", timeout=120)
        server.wait_for(r"joined: lab-a", timeout=120)
    finally:
        fed.stop_all()
    wait_nothing_left(before)
