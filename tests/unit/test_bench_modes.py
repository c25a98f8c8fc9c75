"""`hacfed bench modes` without training: matrix validation, resumability, statistics, report.

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

from hacfed.tools.cli import main
from hacfed.tools.experiments.matrix import MatrixError, load_matrix, parse_matrix
from hacfed.tools.experiments.report import BEGIN, END, ReportPaths, format_difference, replace_section, write_report
from hacfed.tools.experiments.runner import (
    StaleRunError, has_final_rows, plan_runs, run_matrix, runs_of, sim_args, split_done,
)
from hacfed.tools.experiments.stats import mean_ci, paired_difference, t_975
from hacfed.tools.sim import SIM_MODES

ROOT = Path(__file__).resolve().parents[2]

DEFAULTS = {
    "task": "add2", "rounds": 4, "lr": 5e-5, "eval_every": 2, "eval_problems": 50, "eval_split": "test",
    "prompts_per_round": 16, "group_size": 8, "seeds": [0, 1, 2], "modes": ["naive", "gspo2"], "baseline": "gspo2",
}


def _matrix(settings=None, defaults=None, comparisons=None):
    data = {"defaults": dict(DEFAULTS if defaults is None else defaults),
            "settings": settings if settings is not None else {"pair": {"agents": ["m1", "m2"]}}}
    if comparisons is not None:
        data["comparisons"] = comparisons
    return parse_matrix(data, Path("m.toml"))


# --- matrix validation ---------------------------------------------------------------------------

HEADLINE_SETTINGS = ("char-bpe", "state", "size-band", "skills-notation")  # the four kinds of heterogeneity


def test_shipped_matrices_parse():
    modes = load_matrix(ROOT / "bench" / "modes.toml")
    assert modes.names == (*HEADLINE_SETTINGS, "model3", "model", "model3-k1s", "size", "skills", "skills-mostly")
    assert modes.setting("skills-notation").run.task == "chain-notations"
    assert modes.setting("skills").agents == ("chain-llama-add", "chain-qwen2-sub")
    assert modes.setting("size-band").agents == ("chain-qwen2", "chain-qwen2-wide")
    assert modes.setting("model3").run.modes == ("xhacpo",)
    assert modes.setting("model").run.rounds == 20 and modes.comparisons[0].settings == ("model3", "char-bpe")
    for tune in sorted((ROOT / "bench").glob("tune*.toml")):  # settings are chosen on validation only
        assert {s.run.eval_split for s in load_matrix(tune).settings} == {"validation"}, tune
    smoke = load_matrix(ROOT / "bench" / "smoke.toml")
    assert {s.run.task for s in smoke.settings} == {"add2"}
    baselines = load_matrix(ROOT / "bench" / "baselines.toml")
    assert set(baselines.setting("char-bpe").run.modes) == set(SIM_MODES)  # every mode, beside the headline


def test_headline_matrix_holds_what_issue_8_asks():
    """Each kind of heterogeneity: the recommended mode, GSPO×2 and paper HACPO, >= 5 seeds on >= 1,000
    test problems; three labs (as recommended: one best peer group per prompt) compared with two for
    every agent; earlier designs archived, not rerun;
    runs shared with bench/baselines.toml (the same `hacfed sim` command for the same setting, mode, seed)."""
    modes = load_matrix(ROOT / "bench" / "modes.toml")
    for name in HEADLINE_SETTINGS:
        run = modes.setting(name).run
        assert run.modes == ("xhacpo", "gspo2", "hacpo") and run.baseline == "gspo2", name
        assert run.eval_split == "test" and run.eval_problems >= 1000 and len(run.seeds) >= 5, name
    for three in ("model3", "model3-k1s"):
        assert {(c.agent, c.settings[1]) for c in modes.comparisons if c.settings[0] == three} >= {
            ("chain-llama", "char-bpe"), ("chain-qwen2", "char-bpe"), ("chain-gpt2", "model")}, three
    best = modes.setting("model3-k1s").run
    assert (best.peers_per_prompt, best.peer_choice) == (1, "successes")
    assert [s.name for s in modes.settings if s.archived] == ["model3", "size", "skills", "skills-mostly"]
    planned = plan_runs(modes)
    assert {r.setting for r in planned} == {*HEADLINE_SETTINGS, "model3-k1s", "model"}
    assert len(planned) == 70  # ~2 hours on 2 cores at the run times of docs/results.md
    assert {r.setting for r in plan_runs(modes, ["size"])} == {"size"}  # --only reruns an archived one
    baselines = load_matrix(ROOT / "bench" / "baselines.toml")
    for run in plan_runs(modes, ["char-bpe", "size-band"]):
        assert run.sim_args == sim_args(baselines.setting(run.setting), run.mode, run.seed), run.label


def test_three_labs_matrix_repeats_the_headline_comparison_with_more_seeds():
    """bench/three-labs.toml: model3 against char-bpe for the same agents, 10 seeds, its first five runs
    the headline's own (the same `hacfed sim` command, so the same OUT/SETTING/MODE/seed-S is reused);
    model3-k1 (one peer's group per prompt) and model3-k1s (the one with the most verified reward)
    against both; `model` over ten seeds too."""
    modes = load_matrix(ROOT / "bench" / "modes.toml")
    three = load_matrix(ROOT / "bench" / "three-labs.toml")
    pairs = {(c.agent, c.settings) for c in three.comparisons}
    assert {("chain-llama", ("model3", "char-bpe")), ("chain-qwen2", ("model3", "char-bpe")),
            ("chain-gpt2", ("model3-k1", "model"))} <= pairs
    assert {a for a, s in pairs if s == ("model3-k1", "model3")} == {"chain-llama", "chain-gpt2", "chain-qwen2"}
    k1 = three.setting("model3-k1")
    assert k1.run.peers_per_prompt == 1 and k1.agents == modes.setting("model3").agents
    for name in ("model3", "char-bpe", "model"):
        setting = three.setting(name)
        assert setting.agents == modes.setting(name).agents and setting.run.eval_split == "test"
    assert {a for a, s in pairs if s[0] == "model3-k1s"} == {"chain-llama", "chain-gpt2", "chain-qwen2"}
    assert all(len(three.setting(name).run.seeds) == 10 for name in three.names)
    shared = [r for r in plan_runs(three) if r.setting in ("model3", "char-bpe", "model", "model3-k1s") and r.seed < 5]
    assert len(shared) == 20
    for run in shared:
        assert run.sim_args == sim_args(modes.setting(run.setting), run.mode, run.seed), run.label


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_archived_must_be_a_bool(value):
    with pytest.raises(MatrixError, match=r"\[settings.pair\]: archived must be true or false, got"):
        _matrix({"pair": {"agents": ["m1", "m2"], "archived": value}})


def test_setting_overrides_defaults_and_rollout_cost():
    m = _matrix({"a": {"agents": ["m1"], "rounds": 9, "modes": ["gspo2", "gspo"]}})
    run = m.setting("a").run
    assert (run.rounds, run.modes, run.lr) == (9, ("gspo2", "gspo"), 5e-5)
    assert run.rollouts_per_agent_per_round("gspo") == 128  # 16 prompts × G 8
    assert run.rollouts_per_agent_per_round("gspo2") == 256  # × 2: GSPO×2 samples 2G
    assert _matrix({"a": {"agents": ["x", "x"]}}).setting("a").agent_ids == ("x", "x-2")


@pytest.mark.parametrize("change, match", [
    (lambda d: d.update(extra=1), r"unknown key 'extra'"),
    (lambda d: d["defaults"].update(round=3), r"\[defaults\]: unknown key 'round'"),
    (lambda d: d["settings"]["pair"].update(seed=[1]), r"\[settings.pair\]: unknown key 'seed'"),
    (lambda d: d["defaults"].pop("rounds"), r"\[settings.pair\]: missing rounds"),
    (lambda d: d["settings"]["pair"].pop("agents"), r"missing agents"),
    (lambda d: d["defaults"].update(modes=["naive", "bogus"]), r"unknown mode 'bogus'"),
    (lambda d: d["defaults"].update(modes=["naive", "naive"]), r"modes lists a value twice"),
    (lambda d: d["settings"]["pair"].update(baseline="gspo"), r"\[settings.pair\]: baseline 'gspo' is not one of the modes"),
    (lambda d: d["defaults"].update(seeds=[0, 0]), r"seeds must be a non-empty list of distinct ints"),
    (lambda d: d["defaults"].update(seeds=[]), r"seeds must be"),
    (lambda d: d["defaults"].update(rounds=True), r"\[defaults\]: rounds must be an int >= 1, got True"),
    (lambda d: d["settings"]["pair"].update(rounds=0), r"\[settings.pair\]: rounds must be an int >= 1, got 0"),
    (lambda d: d["defaults"].update(lr=-1.0), r"lr must be a number > 0, got -1.0"),
    (lambda d: d["settings"]["pair"].update(minibatch_size=0), r"\[settings.pair\]: minibatch_size must be an int >= 1, got 0"),
    (lambda d: d["defaults"].update(minibatch_size=True), r"\[defaults\]: minibatch_size must be an int >= 1, got True"),
    (lambda d: d["defaults"].update(minibatch_size="96"), r"minibatch_size must be an int >= 1, got '96'"),
    (lambda d: d["defaults"].update(task="chess"), r"task must be one of add2, chain, chain-notations, got 'chess'"),
    (lambda d: d["defaults"].update(eval_split="train"), r"eval_split must be one of test, validation"),
    (lambda d: d["settings"]["pair"].update(agents=["a,b"]), r"without commas"),
    (lambda d: d["settings"]["pair"].update(description=3), r"description must be a string"),
    (lambda d: d["settings"].update({"a b": {"agents": ["m1"]}}), r"a setting name must be"),
    (lambda d: d.update(settings={}), r"no \[settings.NAME\] table"),
    (lambda d: d.update(comparisons=[{"agent": "m1", "mode": "naive", "settings": ["pair", "nope"]}]),
     r"\[\[comparisons\]\] #1: settings: no setting 'nope'"),
    (lambda d: d.update(comparisons=[{"agent": "m9", "mode": "naive", "settings": ["pair", "two"]}]),
     r"agent 'm9' is not in setting 'pair'"),
    (lambda d: d.update(comparisons=[{"agent": "m1", "mode": "gspo", "settings": ["pair", "two"]}]),
     r"mode 'gspo' is not run in setting 'pair'"),
    (lambda d: d.update(comparisons=[{"agent": "m1", "mode": "naive", "settings": ["pair", "pair"]}]),
     r"two different settings"),
    (lambda d: d.update(comparisons=[{"agent": "m1", "mode": "naive"}]), r"#1: missing settings"),
])
def test_bad_matrix_names_the_key(change, match):
    data = {"defaults": dict(DEFAULTS), "settings": {"pair": {"agents": ["m1", "m2"]}, "two": {"agents": ["m1"]}}}
    change(data)
    with pytest.raises(MatrixError, match=match):
        parse_matrix(data, Path("m.toml"))


def test_bad_matrix_file_is_one_line_on_the_command_line(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('[defaults]\nrounds = "ten"\n[settings.a]\nagents = ["m1"]\n')
    assert main(["bench", "modes", "--matrix", str(bad), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "hacfed bench modes: error:" in err
    bad.write_text("[defaults\n")
    assert main(["bench", "modes", "--matrix", str(bad), "--out", str(tmp_path / "out")]) == 2
    assert "is not valid TOML" in capsys.readouterr().err
    assert main(["bench", "modes", "--matrix", str(tmp_path / "none.toml"), "--out", str(tmp_path)]) == 2
    assert "matrix file not found" in capsys.readouterr().err
    smoke = str(ROOT / "bench" / "smoke.toml")
    assert main(["bench", "modes", "--matrix", smoke, "--out", str(tmp_path), "--only", "nope"]) == 2
    assert "no setting 'nope'" in capsys.readouterr().err
    assert main(["bench", "modes", "--matrix", smoke, "--out", str(tmp_path), "--report-only"]) == 2
    assert "no complete runs under" in capsys.readouterr().err


# --- runs on disk and resumability ---------------------------------------------------------------

def _rows(agents, mode, seed, finals, rounds=4, eval_every=2, start=None, pass1=True):
    """Metrics rows as `hacfed sim` writes them; finals[agent] = final greedy accuracy."""
    rows = []
    for r in range(rounds):
        for a in agents:
            row = {"round": r, "agent": a, "mode": mode, "seed": seed, "reward_mean": 0.1}
            if r % eval_every == 0:
                acc = (start or {}).get(a, 0.3) if r == 0 else finals[a] - 0.01
                row["eval_accuracy"] = acc
                if pass1:
                    row["eval_pass1"] = acc / 2
            rows.append(row)
    for a in agents:
        row = {"round": rounds, "agent": a, "mode": mode, "seed": seed, "eval_accuracy": finals[a], "final": True}
        if pass1:
            row["eval_pass1"] = finals[a] / 2
        rows.append(row)
    return rows


def _write_complete(run, out, rows):
    path = run.metrics_path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run.args_path(out).write_text(json.dumps(list(run.sim_args)))


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
    fixed = plan_runs(_matrix({"pair": {"agents": ["m1", "m2"]}, "three": {"agents": ["m1", "m2", "m3"], "minibatch_size": 96}}))
    assert [r.sim_args[-2:] for r in fixed if r.setting == "three"] == [("--minibatch-size", "96")] * 6
    assert all("--minibatch-size" not in r.sim_args for r in fixed if r.setting == "pair")
    # So does a setting's peers per prompt (what each lab is sent, hacfed sim --peers-per-prompt).
    shared = plan_runs(_matrix({"three": {"agents": ["m1", "m2", "m3"], "peers_per_prompt": 1}}))
    assert [r.sim_args[-2:] for r in shared] == [("--peers-per-prompt", "1")] * 6
    with pytest.raises(MatrixError, match=r"\[settings.three\]: peers_per_prompt must be an int >= 1, got 0"):
        _matrix({"three": {"agents": ["m1", "m2", "m3"], "peers_per_prompt": 0}})
    # And which peers (hacfed sim --peer-choice), refused by name when it is not a known choice.
    chosen = plan_runs(_matrix({"three": {"agents": ["m1", "m2", "m3"], "peers_per_prompt": 1, "peer_choice": "successes"}}))
    assert [r.sim_args[-4:] for r in chosen] == [("--peers-per-prompt", "1", "--peer-choice", "successes")] * 6
    assert all("--peer-choice" not in r.sim_args for r in shared)
    with pytest.raises(MatrixError, match=r"\[settings.three\]: peer_choice must be one of drawn, successes, got 'best'"):
        _matrix({"three": {"agents": ["m1", "m2", "m3"], "peer_choice": "best"}})


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
        "seed-0.args.json", "seed-0.jsonl", "seed-0.log", "seed-1.args.json", "seed-1.jsonl", "seed-1.log",
        "seed-2.jsonl.partial", "seed-2.log"]  # the incomplete run stays a .partial, next to its log
    # second start: the 4 complete runs are skipped, only the 2 failed ones run again (and now pass)
    monkeypatch.delenv("FAKE_FAIL")
    monkeypatch.delenv("FAKE_NO_FINAL")
    lines.clear()
    assert run_matrix(runs, out, jobs=2, python=fake_sim, echo=lines.append, poll_s=0.02) == []
    assert "4 of 6 runs already complete" in lines[0]
    assert sum("start " in line for line in lines) == 2
    assert not list(out.rglob("*.partial"))


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


# --- statistics, against numbers worked by hand ----------------------------------------------------

def test_mean_ci_by_hand():
    # mean 0.44; deviations -0.04, 0, 0.04 -> s² = 0.0032 / 2 = 0.0016, s = 0.04
    # se = 0.04 / √3 = 0.0230940; t(0.975, 2) = 4.3027 -> half-width 0.0993665
    e = mean_ci([0.40, 0.44, 0.48])
    assert e.n == 3 and e.mean == pytest.approx(0.44, abs=1e-9)
    assert e.half_width == pytest.approx(0.0993665, abs=1e-6)
    # two values: s = √((0.01 + 0.01) / 1) = 0.141421, se = 0.1, t(0.975, 1) = 12.7062 -> 1.27062
    assert mean_ci([0.1, 0.3]).half_width == pytest.approx(1.27062, abs=1e-6)
    single = mean_ci([0.5])
    assert (single.mean, single.half_width, single.above_zero) == (0.5, None, False)
    with pytest.raises(ValueError):
        mean_ci([])


def test_t_quantiles():
    assert t_975(1) == 12.7062 and t_975(4) == 2.7764 and t_975(30) == 2.0423
    assert t_975(200) == 2.0423  # beyond the table: the df-30 value (a slightly wider interval)
    with pytest.raises(ValueError):
        t_975(0)


def test_paired_difference_by_hand():
    # shared seeds 0, 1, 2 (seed 3 and 5 are in one side only): diffs 0.05, -0.01, 0.08
    # mean 0.04; deviations 0.01, -0.05, 0.04 -> s² = 0.0042 / 2 = 0.0021, s = 0.0458258
    # se = s / √3 = 0.0264575; × 4.3027 = 0.113838; 2 of 3 differences > 0
    d = paired_difference({0: 0.50, 1: 0.46, 2: 0.52, 3: 0.40}, {0: 0.45, 1: 0.47, 2: 0.44, 5: 0.9})
    assert d.seeds == (0, 1, 2) and d.positive == 2
    assert d.estimate.mean == pytest.approx(0.04, abs=1e-9)
    assert d.estimate.half_width == pytest.approx(0.113838, abs=1e-6)
    assert not d.estimate.above_zero
    # diffs 0.02, 0.03, 0.04: mean 0.03, s = 0.01, half-width 4.3027 × 0.01/√3 = 0.0248417 < 0.03
    assert paired_difference({0: 0.52, 1: 0.53, 2: 0.54}, {0: 0.5, 1: 0.5, 2: 0.5}).estimate.above_zero
    assert paired_difference({0: 0.5}, {1: 0.5}) is None
    # 0.3 − (0.1 + 0.2) = -5.6e-17 and (0.1 + 0.2) − 0.3 = +5.6e-17: ties, not wins
    tie = paired_difference({0: 0.1 + 0.2, 1: 0.3}, {0: 0.3, 1: 0.1 + 0.2})
    assert tie.positive == 0 and format_difference(tie).startswith("+0.000 ± 0.000")


# --- the report ------------------------------------------------------------------------------------

FINALS = {  # (mode, seed) -> final greedy accuracy of m1, m2
    ("naive", 0): (0.50, 0.30), ("naive", 1): (0.52, 0.30), ("naive", 2): (0.54, 0.36),
    ("gspo2", 0): (0.40, 0.32), ("gspo2", 1): (0.44, 0.31), ("gspo2", 2): (0.48, 0.30),
}


def _synthetic(out, matrix):
    for run in runs_of(matrix.setting("pair")):
        m1, m2 = FINALS[(run.mode, run.seed)]
        _write_complete(run, out, _rows(["m1", "m2"], run.mode, run.seed, {"m1": m1, "m2": m2},
                                        start={"m1": 0.35, "m2": 0.25}))


def test_report_tables_from_synthetic_runs(tmp_path):
    matrix = _matrix({"pair": {"agents": ["m1", "m2"], "description": "two toy agents"},
                      "later": {"agents": ["m1"]}},
                     comparisons=[{"agent": "m1", "mode": "naive", "settings": ["pair", "later"]}])
    out = tmp_path / "runs"
    _synthetic(out, matrix)
    results = tmp_path / "docs" / "results.md"
    results.parent.mkdir()
    results.write_text("# Results\n\nhand-written text\n")
    paths = ReportPaths(results, tmp_path / "docs" / "img", "hacfed bench modes --matrix m.toml --out runs")
    written = write_report(matrix, out, paths)
    png = tmp_path / "docs" / "img" / "modes-pair.png"
    assert written == [results, png] and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    text = results.read_text()
    assert text.startswith("# Results\n\nhand-written text\n\n" + BEGIN) and text.endswith(END + "\n")
    assert "### pair: two toy agents" in text and "Complete runs: 6 of 6." in text
    assert "hacfed bench modes --matrix m.toml --out runs --only pair" in text
    # m1 naive: 0.50, 0.52, 0.54 -> 0.520 ± 4.3027·0.02/√3 = 0.050; gspo2: 0.40, 0.44, 0.48 -> 0.440 ± 0.099
    # m2 naive: 0.30, 0.30, 0.36 -> s² = 0.0024/2, s = 0.034641 -> 0.320 ± 4.3027·0.02 = 0.086
    assert "| start (round 0) | – | 0.350 | 0.250 |" in text
    assert "| naive | 128 | 0.520 ± 0.050 (n=3) | 0.320 ± 0.086 (n=3) |" in text
    assert "| gspo2 (baseline) | 256 | 0.440 ± 0.099 (n=3) | 0.310 ± 0.025 (n=3) |" in text
    # pass@1 is half the greedy accuracy in these files: m1 naive 0.260 ± 0.025
    assert "| naive | 0.260 ± 0.025 (n=3) | 0.160 ± 0.043 (n=3) |" in text
    # m1: diffs 0.10, 0.08, 0.06 -> +0.080 ± 0.050, all > 0 (bold: CI above 0)
    # m2: diffs -0.02, -0.01, 0.06 -> +0.010 ± 4.3027·0.043589/√3 = 0.108, 1 of 3 > 0
    assert "| naive | **+0.080 ± 0.050** (3/3) | +0.010 ± 0.108 (1/3) |" in text
    assert "**naive** (+0.045 averaged over agents); its CI lies above gspo2 for: m1 (1 of 2 agents)" in text
    assert "![learning curves of pair](img/modes-pair.png)" in text
    assert "### later" in text and "No complete runs yet under" in text
    assert "| m1 | naive | pair vs later | greedy accuracy | 0.520 ± 0.050 (n=3) | – | – |" in text
    # regenerating replaces the section instead of appending a second one
    results.write_text(results.read_text() + "\n## After\n")
    write_report(matrix, out, paths)
    again = results.read_text()
    assert again.count(BEGIN) == 1 and again.endswith("## After\n") and "hand-written text" in again


def _pair_and_later(tmp_path):
    """Two settings with complete runs (pair: FINALS; later: m1 naive 0.45, 0.50, 0.50) and one comparison."""
    matrix = _matrix({"pair": {"agents": ["m1", "m2"]}, "later": {"agents": ["m1"], "modes": ["naive"],
                                                                  "baseline": "naive"}},
                     comparisons=[{"agent": "m1", "mode": "naive", "settings": ["pair", "later"]}])
    out = tmp_path / "runs"
    _synthetic(out, matrix)
    for run, final in zip(runs_of(matrix.setting("later")), (0.45, 0.50, 0.50)):
        _write_complete(run, out, _rows(["m1"], "naive", run.seed, {"m1": final}))
    return matrix, out


def test_comparison_pairs_two_settings_by_seed(tmp_path):
    matrix, out = _pair_and_later(tmp_path)
    write_report(matrix, out, ReportPaths(tmp_path / "r.md", tmp_path / "img", "cmd"))
    text = (tmp_path / "r.md").read_text()
    # pair − later: 0.50−0.45, 0.52−0.50, 0.54−0.50 = 0.05, 0.02, 0.04 -> mean 0.036667
    # deviations 0.013333, -0.016667, 0.003333 -> s² = 0.00046667 / 2, s = 0.0152753
    # half-width 4.3027 · 0.0152753 / √3 = 0.037946 > mean: not bold; 3 of 3 > 0
    assert ("| m1 | naive | pair vs later | greedy accuracy | 0.520 ± 0.050 (n=3) | 0.483 ± 0.072 (n=3) "
            "| +0.037 ± 0.038 (3/3) |") in text
    # a setting with no mode but its baseline has no difference table
    assert text.count("Paired difference mode − gspo2, final greedy accuracy") == 1
    assert "Paired difference mode − naive" not in text


def test_a_setting_without_runs_keeps_its_previous_block(tmp_path):
    """A machine holding only some settings' runs regenerates those and keeps the others' earlier
    blocks (and the comparisons) verbatim, each marked once as kept."""
    matrix, out = _pair_and_later(tmp_path)
    paths = ReportPaths(tmp_path / "r.md", tmp_path / "img", "cmd")
    write_report(matrix, out, paths)
    first = paths.results_md.read_text()
    assert "| naive (baseline) | 128 | 0.483 ± 0.072 (n=3) |" in first and "Kept from the previous report" not in first
    # a fresh machine: later's runs are gone, pair's were rerun with other results
    for run in runs_of(matrix.setting("later")):
        run.metrics_path(out).unlink()
    FINALS_BEFORE = dict(FINALS)
    try:
        FINALS.update({("naive", 0): (0.60, 0.30)})
        _synthetic(out, matrix)
    finally:
        FINALS.clear()
        FINALS.update(FINALS_BEFORE)
    write_report(matrix, out, paths)
    second = paths.results_md.read_text()
    later = second.split("### later", 1)[1]
    assert later.splitlines()[2].startswith("*Kept from the previous report: no complete run of this setting was under")
    assert "| naive (baseline) | 128 | 0.483 ± 0.072 (n=3) |" in later  # the earlier numbers, unchanged
    assert "| pair vs later | greedy accuracy | 0.520 ± 0.050 (n=3) | 0.483 ± 0.072 (n=3)" in second  # kept too
    assert "| naive | 128 | 0.553 ±" in second  # pair regenerated from its new runs: (0.60+0.52+0.54)/3
    write_report(matrix, out, paths)  # kept twice: still one mark per block
    third = paths.results_md.read_text()
    assert third == second and third.count("Kept from the previous report") == 2
    assert "no complete run of some of these settings was under" in third
    # without an earlier block a setting with no runs says so, as before
    paths.results_md.write_text("# fresh\n")
    write_report(matrix, out, paths)
    assert "No complete runs yet under" in paths.results_md.read_text()


def test_report_counts_incomplete_runs_and_single_seeds(tmp_path):
    matrix = _matrix()
    out = tmp_path / "runs"
    _synthetic(out, matrix)
    for run in runs_of(matrix.setting("pair")):
        if run.seed > 0 and run.mode == "naive":
            run.metrics_path(out).rename(run.partial_path(out))  # as if interrupted
    paths = ReportPaths(tmp_path / "r.md", tmp_path / "img", "cmd")
    write_report(matrix, out, paths)
    text = (tmp_path / "r.md").read_text()
    assert "Complete runs: 4 of 6." in text
    # one naive seed left: no interval; the paired difference uses seed 0 only: 0.50 − 0.40
    assert "| naive | 128 | 0.500 (n=1) | 0.300 (n=1) |" in text
    assert "| naive | +0.100 (1/1) | -0.020 (0/1) |" in text


def test_section_markers():
    assert replace_section("", "S") == f"{BEGIN}\nS\n{END}\n"
    doc = f"top\n{BEGIN}\nold\n{END}\nbottom\n"
    assert replace_section(doc, "new") == f"top\n{BEGIN}\nnew\n{END}\nbottom\n"
    for broken in (f"{BEGIN}\nx\n", f"{END}\n{BEGIN}\n", f"{BEGIN}{BEGIN}{END}"):
        with pytest.raises(ValueError, match="fix the markers by hand"):
            replace_section(broken, "new")


def test_cross_diagnostics_are_averaged_over_rounds_then_seeds_and_reported(tmp_path):
    from hacfed.tools.experiments.results import parse_agent_runs

    matrix = _matrix({"pair": {"agents": ["m1", "m2"]}}, defaults={**DEFAULTS, "seeds": [0, 1]})
    out = tmp_path / "runs"
    for run in plan_runs(matrix):
        rows = _rows(["m1", "m2"], run.mode, run.seed, {"m1": 0.5, "m2": 0.4})
        if run.mode == "naive":  # m1 learns from m2: grad_frac 0.2 and 0.4 (seed 0), 0.6 and 0.6 (seed 1)
            for row, frac in zip([r for r in rows if r["agent"] == "m1" and not r.get("final")][1:3],
                                 (0.2, 0.4) if run.seed == 0 else (0.6, 0.6)):
                row.update({"train/cross/m2/grad_frac": frac, "train/cross/m2/ratio_p10": 0.5,
                            "train/cross/m2/ratio_p50": 1.0, "train/cross/m2/ratio_p90": 1.5,
                            "train/cross/m2/pos_frac": 0.25, "train/cross/m2/grad_pos_frac": 1.0,
                            "train/cross/m2/unrelated": 7.0})
        _write_complete(run, out, rows)
    assert parse_agent_runs(_rows(["m1"], "naive", 0, {"m1": 0.5}), ["m1"])["m1"].cross == {}
    paths = ReportPaths(tmp_path / "results.md", tmp_path / "img", "hacfed bench modes --matrix m.toml --out runs")
    write_report(matrix, out, paths)
    text = paths.results_md.read_text()
    # seed means 0.3 and 0.6 -> 0.45; gspo2 shares nothing and m2 logged nothing: one row only
    assert "| naive | m1 | m2 | 0.50/1.00/1.50 | 0.45 | 0.25 | 1.00 |" in text
    assert text.count("| naive | m1 | m2 |") == 1 and "| gspo2 | m1 |" not in text


def test_halves_of_the_mix_are_tabled_per_agent_with_paired_differences(tmp_path):
    from hacfed.tools.experiments.results import parse_agent_runs

    matrix = _matrix({"pair": {"agents": ["m1", "m2"]}}, defaults={**DEFAULTS, "seeds": [0, 1]})
    out = tmp_path / "runs"
    for run in plan_runs(matrix):
        rows = _rows(["m1", "m2"], run.mode, run.seed, {"m1": 0.5, "m2": 0.4})
        for row in rows:
            if row.get("final"):  # naive: m1 reads "word" 0.3 better than gspo2 does, on both seeds
                row.update({"eval_greedy/sym": 0.6, "eval_greedy/word": 0.5 if run.mode == "naive" else 0.2 + 0.1 * run.seed})
            elif row["round"] == 0 and "eval_accuracy" in row:
                row.update({"eval_greedy/sym": 0.4, "eval_greedy/word": 0.1})
        _write_complete(run, out, rows)
    first = parse_agent_runs(_rows(["m1"], "naive", 0, {"m1": 0.5}), ["m1"])["m1"]
    assert first.final_halves == {} and first.start_halves == {}  # runs without halves have none
    paths = ReportPaths(tmp_path / "results.md", tmp_path / "img", "hacfed bench modes --matrix m.toml --out runs")
    write_report(matrix, out, paths)
    text = paths.results_md.read_text()
    assert "| mode | m1: sym | m1: word | m2: sym | m2: word |" in text
    assert "| start (round 0) | 0.400 | 0.100 | 0.400 | 0.100 |" in text
    # word: naive 0.5 on both seeds, the baseline gspo2 0.2 and 0.3 -> +0.25 paired, for m1 and m2
    assert "| naive − gspo2 | +0.000 ± 0.000 (0/2) | +0.250 ± 0.635 (2/2) | +0.000 ± 0.000 (0/2) | +0.250 ± 0.635 (2/2) |" in text
