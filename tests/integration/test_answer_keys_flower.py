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
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from hacfed.tasks.arithmetic import ArithmeticTask
from tests.federation import Federation, coordinator_toml
from tests.processes import running_descendants, wait_nothing_left

SERVER_TOML = coordinator_toml("it-answer-keys", rounds=2, expected_participants=2, min_participants=2,
                               round_deadline_s=300, eval_every=0, answer_keys="coordinator")


@pytest.mark.slow
def test_labs_without_the_answers_train_and_get_verified_rewards(tmp_path: Path,
                                                                 zoo_presets: Callable[..., None]) -> None:
    zoo_presets("tiny-llama", "tiny-gpt2")
    fed = Federation(tmp_path, metrics_out=tmp_path / "metrics.jsonl")
    fed.configure(SERVER_TOML)
    fed.env["OMP_NUM_THREADS"] = "1"
    server_dir = fed.server_dir
    before = running_descendants()
    try:
        server = fed.server("server.log", listen="127.0.0.1:0", wait=False)
        fed.address = server.wait_for(r"hacfed-server: ready: Fleet API on (127\.0\.0\.1:\d+)").group(1)
        # lab-a holds none of the plan's prompts
        lab_a = fed.lab("lab-a", "tiny-llama", extra=("--eval-problems", "4", "--task", "digits=3"))
        lab_b = fed.lab("lab-b", "tiny-gpt2", extra=("--eval-problems", "4"))
        server.wait_for(r"round 0 closed \(quorum\)", timeout=180)  # both answered: nobody refused the plan
        assert server.exit_code(600) == 0, server.text()[-5000:]
        assert lab_a.exit_code(180) == 0, lab_a.text()[-5000:]
        assert lab_b.exit_code(180) == 0, lab_b.text()[-5000:]
    finally:
        fed.stop_all()
    wait_nothing_left(before)
    for lab in (lab_a, lab_b):
        assert "task mismatch" not in lab.text()
        assert "no claims (the coordinator holds the answers)" in lab.text()
        assert "verified reward of round 0" in lab.text(), lab.text()[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
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
