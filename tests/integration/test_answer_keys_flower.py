"""Answer keys stay with the coordinator in a real federation: hacfed-server with
`answer_keys = "coordinator"` and two hacfed-client processes over Flower on loopback.

lab-a's own task is 3-digit addition (`--task digits=3`), so it holds none of the plan's prompts
(2-digit sums): it still rolls out every plan, since the coordinator holds the problems. Neither lab
claims a reward (every claim the journal holds is 0.0); every sample is accepted with the reward the
coordinator's verifier gave it, no reward strike exists, and each lab's console shows its verified
reward of the previous round, which came back with the pool.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hacfed.tasks.arithmetic import ArithmeticTask
from tests.integration.test_federation_flower import Proc, _running_descendants, wait_nothing_left

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

SERVER_TOML = """
run_id = "it-answer-keys"
rounds = 2
prompts_per_round = 2
group_size = 2
expected_participants = 2
min_participants = 2
round_deadline_s = 300
eval_every = 0
state_dir = "server"
answer_keys = "coordinator"
[task]
kind = "arithmetic"
digits = 2
operators = "+"
[sampling]
max_new_tokens = 6
"""


@pytest.mark.slow
def test_labs_without_the_answers_train_and_get_verified_rewards(tmp_path: Path,
                                                                 zoo_presets: Callable[..., None]) -> None:
    zoo_presets("tiny-llama", "tiny-gpt2")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    env.setdefault("HACFED_HOME", str(REPO / ".hacfed-home"))
    (tmp_path / "coordinator.toml").write_text(SERVER_TOML)
    server_dir = tmp_path / "server"
    before = _running_descendants()
    procs: list[Proc] = []

    def client(pid: str, model: str, *extra: str) -> Proc:
        argv = [str(BIN / "hacfed-client"), "--model", model, "--server", address, "--participant-id", pid,
                "--state-dir", str(tmp_path / pid), "--coordinator-key", str(server_dir / "coordinator.pub"),
                "--insecure", "--eval-problems", "4", *extra]
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
        lab_a = client("lab-a", "tiny-llama", "--task", "digits=3")  # holds none of the plan's prompts
        lab_b = client("lab-b", "tiny-gpt2")
        server.wait_for(r"round 0 closed \(quorum\)", timeout=180)  # both answered: nobody refused the plan
        assert server.exit_code(600) == 0, server.text()[-5000:]
        assert lab_a.exit_code(180) == 0, lab_a.text()[-5000:]
        assert lab_b.exit_code(180) == 0, lab_b.text()[-5000:]
    finally:
        for proc in reversed(procs):
            proc.stop()
    wait_nothing_left(before)
    for lab in (lab_a, lab_b):
        assert "task mismatch" not in lab.text()
        assert "no claims (the coordinator holds the answers)" in lab.text()
        assert "verified reward of round 0" in lab.text(), lab.text()[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    judged = [r for r in rows if "accepted" in r]
    assert sorted((r["agent"], r["round"]) for r in judged) == [("lab-a", 0), ("lab-a", 1), ("lab-b", 0),
                                                                ("lab-b", 1)]
    assert all(r["accepted"] == 2 * 2 and r["rejected"] == 0 for r in judged), judged
    task = ArithmeticTask(digits=2, operators="+")
    with sqlite3.connect(server_dir / "journal.sqlite") as db:
        samples = db.execute("SELECT prompt_id, response_text, reward, claimed_reward FROM trajectories").fetchall()
        strikes = db.execute("SELECT COUNT(*) FROM strikes").fetchone()[0]
    assert len(samples) == 2 * 2 * 2 * 2 and strikes == 0
    assert {claimed for *_, claimed in samples} == {0.0}  # nobody claimed anything
    for prompt_id, text, reward, _ in samples:
        assert reward == task.verify(task.problem(prompt_id), text).reward  # the coordinator's verdict
