"""hacfed demo never overwrites an earlier run's results: the default names are numbered, a given path
that exists is refused in one line before anything starts, and a kept state dir that a demo ran in
names the files its resumed run goes on writing."""

from __future__ import annotations

import json

import pytest

from hacfed.tools.demo import OUTPUTS_FILE, demo_outputs


def test_the_first_demo_gets_the_documented_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert demo_outputs(None, None, None) == (tmp_path / "runs" / "demo-metrics.jsonl",
                                              tmp_path / "runs" / "demo-accuracy.png", False)


def test_an_earlier_demos_results_get_a_fresh_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "demo-metrics.jsonl").write_text("{}\n")
    assert demo_outputs(None, None, None)[:2] == (tmp_path / "runs" / "demo-2-metrics.jsonl",
                                                  tmp_path / "runs" / "demo-2-accuracy.png")
    (tmp_path / "runs" / "demo-2-accuracy.png").write_bytes(b"png")  # a plot alone also takes the number
    assert demo_outputs(None, None, None)[0] == tmp_path / "runs" / "demo-3-metrics.jsonl"


@pytest.mark.parametrize("flag", ["--metrics-out", "--plot"])
def test_a_given_path_that_exists_is_refused(flag, tmp_path):
    taken = tmp_path / "taken"
    taken.write_text("earlier results\n")
    metrics, plot = (str(taken), None) if flag == "--metrics-out" else (None, str(taken))
    with pytest.raises(ValueError, match=f"^{flag} {taken} exists \\(an earlier run's results\\)"):
        demo_outputs(metrics, plot, str(tmp_path / "state"))


def test_a_resumed_demo_keeps_its_files(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    metrics, plot = tmp_path / "m.jsonl", tmp_path / "p.png"
    metrics.write_text("{}\n")
    (state / OUTPUTS_FILE).write_text(json.dumps({"metrics": str(metrics), "plot": str(plot)}))
    assert demo_outputs(None, None, str(state)) == (metrics, plot, True)
    assert demo_outputs(str(metrics), None, str(state)) == (metrics, plot, True)


def test_hacfed_demo_refuses_an_existing_metrics_file_before_starting(tmp_path, capsys):
    from hacfed.tools.cli import build_parser
    from hacfed.tools.demo import run_from_args

    taken = tmp_path / "m.jsonl"
    taken.write_text('{"round": 0}\n')
    state = tmp_path / "state"
    args = build_parser().parse_args(["demo", "--metrics-out", str(taken), "--state-dir", str(state)])
    assert run_from_args(args) == 2
    err = capsys.readouterr().err
    assert err == f"hacfed demo: error: --metrics-out {taken} exists (an earlier run's results); give a new path " \
                  "or move it away\n"
    assert taken.read_text() == '{"round": 0}\n' and not state.exists()


def test_the_default_paths_are_not_fixed_in_the_parser():
    from hacfed.tools.cli import build_parser

    args = build_parser().parse_args(["demo"])
    assert args.metrics_out is None and args.plot is None  # chosen by demo_outputs, never overwritten
