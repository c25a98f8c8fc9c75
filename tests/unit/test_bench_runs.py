"""`hacfed bench modes`: which runs are done, the `hacfed sim` command line of a run, the runner.

The runner is exercised with a fake `hacfed sim` (a small script standing in for the interpreter)
that writes metrics rows in the real format, so these tests take seconds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hacfed.tools.experiments.matrix import MatrixError
from hacfed.tools.experiments.runner import StaleRunError, has_final_rows, plan_runs, run_matrix, split_done
from tests.unit.test_bench_modes import DEFAULTS, _matrix, _rows, _write_complete


def test_sim_command_line_of_a_run():
    run = plan_runs(_matrix())[0]
    assert (run.setting, run.mode, run.seed) == ("pair", "naive", 0)  # seed-major: both modes of seed 0 first
    assert run.sim_args == (
        "sim", "--agents", "m1,m2", "--mode", "naive", "--seed", "0", "--task", "add2", "--rounds", "4",
        "--lr", "5e-05", "--eval-every", "2", "--eval-problems", "50", "--eval-split", "test",
        "--prompts-per-round", "16", "--group-size", "8", "--threads", "1", "--quiet", "--eval-sampled",
    )
    assert run.metrics_path(Path("o")) == Path("o/pair/naive/seed-0.jsonl")
    # A setting's minibatch size reaches `hacfed sim`; without one, the command line is as before.
    fixed = plan_runs(_matrix({"pair": {"agents": ["m1", "m2"]},
                               "three": {"agents": ["m1", "m2", "m3"], "minibatch_size": 96}}))
    assert [r.sim_args[-2:] for r in fixed if r.setting == "three"] == [("--minibatch-size", "96")] * 6
    assert all("--minibatch-size" not in r.sim_args for r in fixed if r.setting == "pair")
    # So does a setting's peers per prompt (what each lab is sent, hacfed sim --peers-per-prompt).
    shared = plan_runs(_matrix({"three": {"agents": ["m1", "m2", "m3"], "peers_per_prompt": 1}}))
    assert [r.sim_args[-2:] for r in shared] == [("--peers-per-prompt", "1")] * 6
    with pytest.raises(MatrixError, match=r"\[settings.three\]: peers_per_prompt must be an int >= 1, got 0"):
        _matrix({"three": {"agents": ["m1", "m2", "m3"], "peers_per_prompt": 0}})
    # And which peers (hacfed sim --peer-choice), refused by name when it is not a known choice.
    chosen = plan_runs(_matrix({"three": {"agents": ["m1", "m2", "m3"], "peers_per_prompt": 1,
                                          "peer_choice": "successes"}}))
    assert [r.sim_args[-4:] for r in chosen] == [("--peers-per-prompt", "1", "--peer-choice", "successes")] * 6
    assert all("--peer-choice" not in r.sim_args for r in shared)
    with pytest.raises(MatrixError,
                       match=r"\[settings.three\]: peer_choice must be one of drawn, successes, got 'best'"):
        _matrix({"three": {"agents": ["m1", "m2", "m3"], "peer_choice": "best"}})
    # And who holds the answer keys (hacfed sim --answer-keys); absent, sim's default and no option.
    keyed = plan_runs(_matrix({"three": {"agents": ["m1", "m2", "m3"], "answer_keys": "coordinator"}}))
    assert [r.sim_args[-2:] for r in keyed] == [("--answer-keys", "coordinator")] * 6
    assert all("--answer-keys" not in r.sim_args for r in shared)
    with pytest.raises(MatrixError,
                       match=r"\[settings.three\]: answer_keys must be one of public, coordinator, got 'lab'"):
        _matrix({"three": {"agents": ["m1", "m2", "m3"], "answer_keys": "lab"}})
    # And whether a success counts once (hacfed sim --dedup-successes).
    deduped = plan_runs(_matrix({"three": {"agents": ["m1", "m2", "m3"], "dedup_successes": True}}))
    assert [r.sim_args[-1] for r in deduped] == ["--dedup-successes"] * 6
    assert all("--dedup-successes" not in r.sim_args for r in keyed)
    # And whether a success outside the task's format earns nothing (hacfed sim --format-gate).
    gated = plan_runs(_matrix({"three": {"agents": ["m1", "m2", "m3"], "format_gate": True}}))
    assert [r.sim_args[-1] for r in gated] == ["--format-gate"] * 6
    assert all("--format-gate" not in r.sim_args for r in deduped)
    # And known canaries every honest lab's filter drops (hacfed sim --deny, once per string).
    denied = plan_runs(_matrix({"three": {"agents": ["m1", "m2", "m3"], "deny": ["evil.example", "b c"]}}))
    assert [r.sim_args[-4:] for r in denied] == [("--deny", "evil.example", "--deny", "b c")] * 6
    assert all("--deny" not in r.sim_args for r in gated)
    with pytest.raises(MatrixError, match=r"\[settings.three\]: deny"):
        _matrix({"three": {"agents": ["m1", "m2", "m3"], "deny": "evil.example"}})
    # And bounded staleness on a simulated clock (hacfed sim --max-staleness, --lab-speed).
    paced = plan_runs(_matrix({"pair": {"agents": ["m1", "m2"], "max_staleness": 2, "lab_speed": ["m2=4"]}}))
    assert [r.sim_args[-4:] for r in paced] == [("--max-staleness", "2", "--lab-speed", "m2=4")] * 6
    assert all("--max-staleness" not in r.sim_args and "--lab-speed" not in r.sim_args for r in keyed)
    with pytest.raises(MatrixError, match=r"\[settings.pair\]: max_staleness must be an int >= 0, got -1"):
        _matrix({"pair": {"agents": ["m1", "m2"], "max_staleness": -1}})


def test_complete_runs_are_skipped_partial_and_missing_ones_rerun(tmp_path):
    runs = plan_runs(_matrix())
    finished, partial = runs[0], runs[1]
    _write_complete(finished, tmp_path, _rows(["m1", "m2"], "naive", 0, {"m1": 0.5, "m2": 0.4}))
    partial.partial_path(tmp_path).parent.mkdir(parents=True, exist_ok=True)
    partial.partial_path(tmp_path).write_text(json.dumps({"round": 0, "agent": "m1"}) + "\n")
    done, todo = split_done(runs, tmp_path)
    assert done == [finished] and todo == runs[1:] and len(runs) == 6


def test_a_complete_run_made_with_other_arguments_is_an_error(tmp_path):
    run = plan_runs(_matrix())[0]
    _write_complete(run, tmp_path, _rows(["m1", "m2"], "naive", 0, {"m1": 0.5, "m2": 0.4}))
    changed = plan_runs(_matrix({"pair": {"agents": ["m1", "m2"], "rounds": 5}}))
    with pytest.raises(StaleRunError, match="was not made by this matrix's command"):
        split_done(changed, tmp_path)


def test_final_rows_must_cover_every_agent(tmp_path):
    path = tmp_path / "x.jsonl"
    rows = _rows(["m1", "m2"], "naive", 0, {"m1": 0.5, "m2": 0.4})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert has_final_rows(path, ["m1", "m2"])
    path.write_text("".join(json.dumps(r) + "\n" for r in rows[:-1]))  # m2's final row missing
    assert not has_final_rows(path, ["m1", "m2"])
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "{trunc")  # killed mid-write
    assert not has_final_rows(path, ["m1", "m2"])
    assert not has_final_rows(tmp_path / "missing.jsonl", ["m1"])


FAKE_SIM = """\
#!{python}
# Stands in for `python -m hacfed.tools.cli sim ...`: writes the rows of a 2-round run, honours FAKE_* env.
import json, os, sys, time
args = sys.argv[3:]
opt = lambda name: args[args.index(name) + 1]
mode, seed = opt("--mode"), int(opt("--seed"))
with open(os.environ["FAKE_PIDS"], "a") as f:
    f.write(f"{{os.getpid()}}\\n")
time.sleep(float(os.environ.get("FAKE_SLEEP", "0")))
if f"{{mode}}:{{seed}}" in os.environ.get("FAKE_FAIL", ""):
    print("Traceback: something broke in", mode, seed, file=sys.stderr)
    sys.exit(3)
with open(opt("--metrics-out"), "w") as out:
    for agent in opt("--agents").split(","):
        out.write(json.dumps({{"round": 0, "agent": agent, "eval_accuracy": 0.3}}) + "\\n")
        if f"{{mode}}:{{seed}}" not in os.environ.get("FAKE_NO_FINAL", ""):
            out.write(json.dumps({{"round": 2, "agent": agent, "eval_accuracy": 0.4, "final": True}}) + "\\n")
"""


@pytest.fixture()
def fake_sim(tmp_path, monkeypatch):
    script = tmp_path / "fake-python"
    script.write_text(FAKE_SIM.format(python=sys.executable))
    script.chmod(0o755)
    monkeypatch.setenv("FAKE_PIDS", str(tmp_path / "pids"))
    return str(script)


def test_runner_runs_publishes_and_reports_failures(tmp_path, fake_sim, monkeypatch):
    out, lines = tmp_path / "out", []
    runs = plan_runs(_matrix())
    monkeypatch.setenv("FAKE_FAIL", "naive:1")
    monkeypatch.setenv("FAKE_NO_FINAL", "gspo2:2")
    failed = run_matrix(runs, out, jobs=2, python=fake_sim, echo=lines.append, poll_s=0.02)
    assert [r.label for r in failed] == ["pair/naive seed 1", "pair/gspo2 seed 2"]
    text = "\n".join(lines)
    assert "FAILED pair/naive seed 1 (exit 3)" in text and "Traceback: something broke in naive 1" in text
    assert "FAILED pair/gspo2 seed 2 (no final row for every agent)" in text
    assert "4/6 complete, 2 failed" in text and "ETA" in text
    assert sorted(p.name for p in (out / "pair" / "gspo2").iterdir()) == [
        "seed-0.args.json", "seed-0.jsonl", "seed-0.lock", "seed-0.log", "seed-1.args.json", "seed-1.jsonl",
        "seed-1.lock", "seed-1.log", "seed-2.jsonl.partial", "seed-2.lock", "seed-2.log",
    ]  # the incomplete run stays a .partial, next to its log
    # second start: the 4 complete runs are skipped, only the 2 failed ones run again (and now pass)
    monkeypatch.delenv("FAKE_FAIL")
    monkeypatch.delenv("FAKE_NO_FINAL")
    lines.clear()
    assert run_matrix(runs, out, jobs=2, python=fake_sim, echo=lines.append, poll_s=0.02) == []
    assert "4 of 6 runs already complete" in lines[0]
    assert sum("start " in line for line in lines) == 2
    assert not list(out.rglob("*.partial"))


def test_two_invocations_on_one_out_run_each_run_once(tmp_path, fake_sim, monkeypatch):
    """A second `hacfed bench modes` on the same --out (a restart while the first still runs) takes
    the runs the first does not hold, and skips those it holds or completed meanwhile."""
    import threading

    out, runs = tmp_path / "out", plan_runs(_matrix())
    monkeypatch.setenv("FAKE_SLEEP", "0.2")
    lines: list[list[str]] = [[], []]
    failed: list[list] = [[], []]

    def invoke(i: int) -> None:
        failed[i] = run_matrix(runs, out, jobs=1, python=fake_sim, echo=lines[i].append, poll_s=0.02)

    threads = [threading.Thread(target=invoke, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert failed == [[], []] and split_done(runs, out)[0] == runs
    executed = (tmp_path / "pids").read_text().split()
    assert len(executed) == len(runs), (lines, executed)  # each run ran once, in one of the two
    started = [sum(line.split("] ", 1)[1].startswith("start ") for line in ls) for ls in lines]
    assert sum(started) == len(runs), lines
    assert any("skip  " in line for ls in lines for line in ls)


def test_a_run_another_invocation_holds_is_left_to_it(tmp_path, fake_sim):
    from hacfed.tools.experiments.runner import claim

    out, runs = tmp_path / "out", plan_runs(_matrix())
    held = claim(runs[0], out)
    assert held is not None and claim(runs[0], out) is None  # the lock excludes a second holder
    lines: list[str] = []
    try:
        assert run_matrix(runs, out, jobs=2, python=fake_sim, echo=lines.append, poll_s=0.02) == []
    finally:
        os.close(held)
    assert f"skip  {runs[0].label}: another hacfed bench modes is running it" in "\n".join(lines)
    assert len((tmp_path / "pids").read_text().split()) == len(runs) - 1
    assert split_done(runs, out)[1] == [runs[0]]  # still to run, by whoever holds it


def test_sigterm_stops_the_children_and_exits_non_zero(tmp_path, fake_sim):
    """The runner in its own process; SIGTERM must leave no fake sim running."""
    pids = tmp_path / "pids"
    code = textwrap.dedent(f"""
        from pathlib import Path
        from hacfed.tools.experiments.matrix import parse_matrix
        from hacfed.tools.experiments.runner import plan_runs, run_matrix
        data = {{"defaults": {DEFAULTS!r}, "settings": {{"pair": {{"agents": ["m1"]}}}}}}
        run_matrix(plan_runs(parse_matrix(data, Path("m.toml"))), Path({str(tmp_path / 'out')!r}),
                   jobs=2, python={fake_sim!r}, poll_s=0.02)
    """)
    env = {**os.environ, "FAKE_SLEEP": "60", "FAKE_PIDS": str(pids)}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not (pids.exists() and len(pids.read_text().split()) == 2):
        assert time.monotonic() < deadline, "the two children never started"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    stdout, _ = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM
    assert "interrupted: stopped 2 running run(s)" in stdout
    for pid in map(int, pids.read_text().split()):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_run_beside_a_scripted_hostile_lab_is_complete_with_the_honest_final_rows(tmp_path):
    # copy-gold, canary and weak have no model, so they write no final row; lie-logprob evaluates.
    matrix = _matrix({"bad": {"agents": ["m1", "m2", "hostile:weak"]},
                      "liar": {"agents": ["m1", "m2", "hostile:lie-logprob"]}})
    bad, liar = plan_runs(matrix, only=["bad"])[0], plan_runs(matrix, only=["liar"])[0]
    assert bad.agent_ids == ("m1", "m2") and liar.agent_ids == ("m1", "m2", "hostile-lie-logprob")
    rows = _rows(["m1", "m2"], bad.mode, bad.seed, {"m1": 0.5, "m2": 0.4})
    bad.partial_path(tmp_path).parent.mkdir(parents=True)
    bad.partial_path(tmp_path).write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert has_final_rows(bad.partial_path(tmp_path), bad.agent_ids)
    assert not has_final_rows(bad.partial_path(tmp_path), liar.agent_ids)
