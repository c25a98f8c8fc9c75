"""`hacfed bench modes` without training: matrix validation and the statistics.

The runs on disk and the runner are tested in test_bench_runs.py, the report in test_bench_report.py;
both use the matrix and metrics-row helpers defined here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hacfed.tools.cli import main
from hacfed.tools.experiments.matrix import MatrixError, load_matrix, parse_matrix
from hacfed.tools.experiments.report import format_difference
from hacfed.tools.experiments.runner import plan_runs, sim_args
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
    (lambda d: d["settings"]["pair"].update(baseline="gspo"),
     r"\[settings.pair\]: baseline 'gspo' is not one of the modes"),
    (lambda d: d["defaults"].update(seeds=[0, 0]), r"seeds must be a non-empty list of distinct ints"),
    (lambda d: d["defaults"].update(seeds=[]), r"seeds must be"),
    (lambda d: d["defaults"].update(rounds=True), r"\[defaults\]: rounds must be an int >= 1, got True"),
    (lambda d: d["settings"]["pair"].update(rounds=0), r"\[settings.pair\]: rounds must be an int >= 1, got 0"),
    (lambda d: d["defaults"].update(lr=-1.0), r"lr must be a number > 0, got -1.0"),
    (lambda d: d["settings"]["pair"].update(minibatch_size=0),
     r"\[settings.pair\]: minibatch_size must be an int >= 1, got 0"),
    (lambda d: d["defaults"].update(minibatch_size=True),
     r"\[defaults\]: minibatch_size must be an int >= 1, got True"),
    (lambda d: d["defaults"].update(minibatch_size="96"), r"minibatch_size must be an int >= 1, got '96'"),
    (lambda d: d["defaults"].update(task="chess"),
     r"task must be one of add2, add2-words, add2-story, gsm8k, chain, chain-notations, got 'chess'"),
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


# --- metrics rows as a run leaves them on disk (shared with the runner and report tests) ------------

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
