"""`hacfed-client --nproc 2` in a real federation over Flower on loopback: lab-a trains and rolls
out on two gloo ranks (hacfed-client and one child rank), lab-b on one. Only rank 0 talks to the
coordinator; every submission of lab-a is complete (the coordinator accepts only the planned prompts
with groups of G) and the run finishes. lab-a stays (--stay); when its rank 1 is then killed, lab-a
stops on its own with an error naming the rank and exit code 1, and no rank or SuperNode is left running."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from tests.federation import coordinator_toml
from tests.processes import BIN, Proc, cli_env, running_descendants, still_running

SERVER_TOML = coordinator_toml("it-ddp", rounds=3, prompts_per_round=3, expected_participants=2, min_participants=2,
                               round_deadline_s=300, eval_every=2)


@pytest.mark.slow
def test_a_lab_with_two_ranks_finishes_a_federation(tmp_path: Path, zoo_presets: Callable[..., None]) -> None:
    zoo_presets("tiny-llama", "tiny-gpt2")
    env = {**cli_env(), "OMP_NUM_THREADS": "1"}
    (tmp_path / "coordinator.toml").write_text(SERVER_TOML)
    server_dir = tmp_path / "server"
    before = running_descendants()
    procs: list[Proc] = []
    ranks: set[int] = set()

    def client(pid: str, model: str, *extra: str) -> Proc:
        argv = [str(BIN / "hacfed-client"), "--model", model, "--server", address, "--participant-id", pid,
                "--state-dir", str(tmp_path / pid), "--coordinator-key", str(server_dir / "coordinator.pub"),
                "--insecure", "--eval-problems", "10", *extra]
        proc = Proc(pid, argv, tmp_path / f"{pid}.log", env)
        procs.append(proc)
        key = tmp_path / pid / "participant.pub"
        deadline = time.monotonic() + 120
        while not key.exists():
            assert time.monotonic() < deadline and proc.popen.poll() is None, proc.text()
            time.sleep(0.1)
        shutil.copy(key, server_dir / "keys" / f"{pid}.pub")
        return proc

    try:
        argv = [str(BIN / "hacfed-server"), "--config", str(tmp_path / "coordinator.toml"), "--insecure",
                "--listen", "127.0.0.1:0", "--state-dir", str(server_dir), "--metrics-out", str(tmp_path / "m.jsonl")]
        server = Proc("server", argv, tmp_path / "server.log", env)
        procs.append(server)
        address = server.wait_for(r"hacfed-server: ready: Fleet API on (127\.0\.0\.1:\d+)").group(1)
        lab_a = client("lab-a", "tiny-llama", "--nproc", "2", "--stay")
        lab_b = client("lab-b", "tiny-gpt2")
        server.wait_for(r"round 0 closed", timeout=300)
        ranks = {p.pid for p in psutil.Process(lab_a.popen.pid).children(recursive=True)
                 if "hacfed.clients.distributed" in " ".join(p.cmdline())}
        assert len(ranks) == 1  # rank 1; rank 0 is hacfed-client itself
        assert server.exit_code(600) == 0, server.text()[-5000:]
        assert lab_b.exit_code(180) == 0, lab_b.text()[-5000:]
        lab_a.wait_for(r"--stay: still serving", timeout=180)
        (rank_pid,) = ranks
        os.kill(rank_pid, signal.SIGKILL)  # a rank dies while the lab is idle
        assert lab_a.exit_code(60) == 1, lab_a.text()[-5000:]  # SIGTERM path, exit 1: the lab failed
        assert re.search(rf"hacfed-client: error: data-parallel training failed while waiting for the next round: "
                         rf"rank 1 \(pid {rank_pid}\) exited with code -9; stopping the lab", lab_a.text()), \
        lab_a.text()[-3000:]
    finally:
        for proc in reversed(procs):
            proc.stop()
    assert not still_running(ranks), "a data-parallel rank outlived its hacfed-client"
    assert not (running_descendants() - before)
    rows = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    mine = [r for r in rows if r.get("agent") == "lab-a" and "accepted" in r]
    assert sorted(r["round"] for r in mine) == [0, 1, 2]
    assert all(r["accepted"] == 3 * 2 and r["rejected"] == 0 for r in mine), mine
    assert any("train/num_updates" in r for r in mine)  # lab-a trained (data-parallel) on pooled rounds
    assert "federation finished: 3 rounds, final reports from ['lab-a', 'lab-b']" in server.text()
