"""A lab's own task in a real federation: the example task package (examples/hacfed-task-example,
installed by scripts/bootstrap.sh --test) named in the [task] of a real hacfed-server and of three
hacfed-client processes over Flower on loopback.

lab-a (tiny-llama) and lab-b (tiny-gpt2) are honest; lab-c (tests/lying_lab.py: hacfed-client
claiming the opposite of every reward) must earn strikes and quarantine from the coordinator, which
re-verifies every claim with the plugin's reward in its sandboxed worker. The train data is Parquet
with field names of its own (`word`, `backwards`), the eval data JSON lines. Half the train problems
have an empty answer, which every response ends with, so the plugin gives them 1.0 and the real
reversed words less (these tiny models do not reverse words; at most a letter or two in place): the
journal holds both kinds of verdict, each the one the labs claimed. Tiny rounds (2 rounds of 2
prompts x G=2, 8 new tokens, 4 eval problems).
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
import tomllib
from pathlib import Path

import pytest

from tests.federation import Federation, coordinator_toml
from tests.processes import REPO, Proc, running_descendants

EXAMPLE_DATA = REPO / "examples" / "hacfed-task-example" / "data"
TASK = """
[task]
kind = "plugin"
plugin = "reverse-word"
train_files = ["train.parquet"]
eval_files = ["{eval}"]
question_field = "word"
answer_field = "backwards"
cache_dir = "{cache}"
[task.sandbox]
timeout_s = 10
"""


def _write_task(tmp_path: Path) -> str:
    import pyarrow
    import pyarrow.parquet

    words = ["apple", "river", "stone", "cloud", "green", "light", "bread", "chair"]
    answers = [w[::-1] if i % 2 else "" for i, w in enumerate(words)]
    pyarrow.parquet.write_table(pyarrow.table({"word": words, "backwards": answers}), tmp_path / "train.parquet")
    eval_file = tmp_path / "eval.jsonl"
    rows = [{"word": p["question"], "backwards": p["answer"]}
            for p in map(json.loads, (EXAMPLE_DATA / "eval.jsonl").read_text().splitlines())]
    eval_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return TASK.format(eval=eval_file.name, cache=tmp_path / "hf-datasets")


def _wait_for_the_run(server: Proc, labs: list[Proc], timeout: float) -> None:
    """Until hacfed-server exits; a lab that fails first fails the test at once, with its log."""
    deadline = time.monotonic() + timeout
    while server.popen.poll() is None:
        for lab in labs:
            assert lab.popen.poll() in (None, 0), \
                f"{lab.name} exited with {lab.popen.returncode}:\n{lab.text()[-3000:]}"
        assert time.monotonic() < deadline, f"the run did not end within {timeout}s:\n{server.text()[-5000:]}"
        time.sleep(0.5)


@pytest.mark.slow
def test_a_plugin_task_federation_verifies_every_claim_and_quarantines_a_liar(tmp_path: Path) -> None:
    task = _write_task(tmp_path)
    (tmp_path / "lab.toml").write_text(task)
    fed = Federation(tmp_path)
    fed.configure(coordinator_toml("it-plugin", rounds=2, expected_participants=2, min_participants=2, eval_every=1,
                                   max_strikes=3, task=tomllib.loads(task)["task"], max_new_tokens=8))
    server_dir = fed.server_dir
    before = running_descendants()
    lab_flags = ("--config", str(tmp_path / "lab.toml"), "--eval-problems", "4")
    try:
        server = fed.server("server.log", listen="127.0.0.1:0", wait=False)
        fed.address = server.wait_for(r"hacfed-server: ready: Fleet API on (127\.0\.0\.1:\d+)").group(1)
        liar = fed.lab("lab-c", "tiny-llama", cheat=True, extra=lab_flags)
        server.wait_for(r"joined: lab-c")
        lab_a, lab_b = fed.lab("lab-a", "tiny-llama", extra=lab_flags), fed.lab("lab-b", "tiny-gpt2", extra=lab_flags)
        _wait_for_the_run(server, [lab_a, lab_b, liar], timeout=400)
        assert server.exit_code(30) == 0, server.text()[-5000:]
        for lab in (lab_a, lab_b, liar):
            assert lab.exit_code(120) == 0, lab.text()[-3000:]
    finally:
        fed.stop_all()
    after = running_descendants()

    assert "federation finished: 2 rounds, final reports from ['lab-a', 'lab-b']" in server.text()
    assert "torch imported: ServerApp False, hacfed-server False" in server.text()
    for lab in (lab_a, lab_b):
        assert "task reverse-word" in lab.text()
        assert re.search(r"round \d: receipt seq \d+ \(content [0-9a-f]{12}\): accepted 4", lab.text()), lab.text()
    assert re.search(r"round 0: receipt seq \d+ .*accepted 0; rejected 4: .*HACFED-E-REWARD-MISMATCH", liar.text())

    with sqlite3.connect(f"file:{server_dir / 'journal.sqlite'}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT participant_id, prompt_id, reward, claimed_reward FROM trajectories").fetchall()
        mismatches = db.execute("SELECT COUNT(*) FROM rejections WHERE participant_id='lab-c' "
                                "AND code='HACFED-E-REWARD-MISMATCH'").fetchone()[0]
        honest_rejections = db.execute("SELECT COUNT(*) FROM rejections WHERE participant_id IN ('lab-a', 'lab-b')"
                                       ).fetchone()[0]
        quarantined = db.execute("SELECT quarantined FROM participants WHERE participant_id='lab-c'").fetchone()[0]
    # round 0 opens with the first two labs connected (the liar and one honest lab), round 1 with both honest ones
    assert {pid for pid, *_ in rows} == {"lab-a", "lab-b"} and len(rows) >= 3 * 2 * 2
    assert all(prompt.startswith("reverse-word:") for _, prompt, _, _ in rows)
    assert all(reward == claimed for *_, reward, claimed in rows)  # the plugin's verdicts, the same at both ends
    rewards = {reward for *_, reward, _ in rows}
    assert 1.0 in rewards and min(rewards) < 1.0, rows
    assert mismatches >= 3 and quarantined == 1 and honest_rejections == 0
    assert after - before == set()
