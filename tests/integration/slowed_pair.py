"""Two labs over real Flower, one at `hacfed-client --slowdown`, the coordinator killed with SIGKILL
mid-run and started again: what test_slowdown_flower.py (K = 0) and test_staleness_flower.py (K = 1)
share.

    run = run_with_a_kill(tmp_path, server_toml("it-x", rounds=5), factor=4, before_kill=wait_for_it)
    check_finished_run(run, "it-x", rounds=5, continued_round=2)

hacfed-server and two hacfed-client processes (lab-a at full speed, lab-b slowed) of the tiny-llama
preset on loopback (tests/federation.py); `before_kill(federation, first_server)` decides when to kill (its
result is kept), then the whole coordinator is killed (`Federation.kill_tree`) and started again with the
same command, and the run goes to its end. `check_finished_run` checks what both tests require of the
end: the restart resumed the open round, every round closed at quorum with both labs' samples, none
refused, every receipt a lab holds in the journal exactly once (`check_receipts_in_journal`), both
labs ended normally and no process printed a traceback.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.federation import TRACE, Federation, TomlValue, coordinator_toml
from tests.processes import running_descendants, still_running, wait_nothing_left

LABS = ("lab-a", "lab-b")  # lab-b is the slowed one
PER_ROUND = 2 * 2  # samples per lab and round: 2 prompts x G = 2


def server_toml(run_id: str, rounds: int, **settings: TomlValue) -> str:
    """A small arithmetic run for the two labs; `settings`: more top-level keys (e.g. max_staleness)."""
    return coordinator_toml(run_id, rounds=rounds, expected_participants=2, min_participants=2, round_deadline_s=600,
                            eval_every=0, **settings)


@dataclass
class PairRun:
    """The processes and journal of one `run_with_a_kill`, and what `before_kill` returned."""

    view: Federation  # the journal, the labs' outboxes and the processes
    first: Any  # the killed hacfed-server
    second: Any  # the restarted one
    lab_a: Any
    lab_b: Any
    before_kill: Any


def run_with_a_kill(tmp_path: Path, toml: str, factor: int,
                    before_kill: Callable[[Federation, Any], Any]) -> PairRun:
    """Run the two labs to the end with one kill -9 of the coordinator (module docstring); every
    process ended and nothing of them left running."""
    fed = Federation(tmp_path, metrics_out=tmp_path / "metrics.jsonl")
    fed.env["OMP_NUM_THREADS"] = "1"
    fed.configure(toml)
    before = running_descendants()
    try:
        first = fed.server("server-1.log", listen="127.0.0.1:0", wait=False)
        fed.address = first.wait_for(r"hacfed-server: ready: Fleet API on (127\.0\.0\.1:\d+)").group(1)
        lab_a = fed.lab("lab-a", "tiny-llama", extra=("--eval-problems", "4"))
        lab_b = fed.lab("lab-b", "tiny-llama", extra=("--eval-problems", "4", "--slowdown", str(factor)))
        waited = before_kill(fed, first)
        fed.kill_tree(first)  # kill -9 of hacfed-server, its SuperLink and its ServerApp
        killed = set(fed.seen)
        second = fed.server("server-2.log", listen="127.0.0.1:0", wait=False)  # the same command
        assert second.wait_for(r"ready: Fleet API on (\S+) ").group(1) == fed.address
        assert second.exit_code(600) == 0, second.text()[-5000:]
        assert lab_a.exit_code(180) == 0, lab_a.text()[-5000:]
        assert lab_b.exit_code(180) == 0, lab_b.text()[-5000:]
    finally:
        fed.stop_all()
    wait_nothing_left(before)
    assert still_running(killed) == set()
    return PairRun(fed, first, second, lab_a, lab_b, waited)


def check_finished_run(run: PairRun, run_id: str, rounds: int, continued_round: int) -> None:
    """What every slowed-pair run must end with (module docstring)."""
    view, text2 = run.view, run.second.text()
    assert re.search(rf"coordinator ready \(run {run_id}\): round {continued_round} continues", text2), text2[-3000:]
    assert f"federation finished: {rounds} rounds, final reports from ['lab-a', 'lab-b']" in text2

    # every round closed at quorum; both labs' samples in every round, none refused
    closed = view.rows("SELECT round_id, state, close_reason FROM rounds ORDER BY round_id")
    assert [(r, reason) for r, state, reason in closed if state != "OPEN"] == [(r, "quorum") for r in range(rounds)]
    per_lab_round = view.rows("SELECT participant_id, round_id, COUNT(*) FROM trajectories "
                              "GROUP BY participant_id, round_id")
    assert sorted(per_lab_round) == [(pid, r, PER_ROUND) for pid in LABS for r in range(rounds)]
    assert view.rows("SELECT COUNT(*) FROM rejections") == [(0,)]
    assert view.rows("SELECT COUNT(*) FROM strikes") == [(0,)]
    assert view.integrity() == "ok"

    # receipts: exactly once in the journal, nothing there without one; each lab ended normally
    assert view.check_receipts_in_journal(list(LABS)) == {pid: rounds * PER_ROUND for pid in LABS}
    for pid, lab in (("lab-a", run.lab_a), ("lab-b", run.lab_b)):
        assert re.search(rf"the federation is done: the coordinator closed run {run_id} for {pid}; "
                         r"final held-out accuracy \d\.\d{3}; checkpoints in \S+\. Exiting\.", lab.text()), pid
        assert not TRACE.search(lab.text()), lab.text()[-3000:]
    for server in (run.first, run.second):
        assert not TRACE.search(server.text()), server.text()[-3000:]
