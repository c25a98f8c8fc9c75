"""bench/greedy_eval_speed.py: the fields docs/results.md reads, on a tiny model; its refusals."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

import hacfed.models.loading
from hacfed.models.zoo import build_untrained

BENCH = Path(__file__).resolve().parents[2] / "bench" / "greedy_eval_speed.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("greedy_eval_speed_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_both_evaluators_run_and_every_field_is_written(bench, monkeypatch, tmp_path, capsys):
    model, tok = build_untrained("tiny-llama", seed=0)
    monkeypatch.setattr(hacfed.models.loading, "load_model", lambda name, progress: SimpleNamespace(
        model=model, tokenizer=tok))
    out = tmp_path / "greedy.json"
    bench.main(["--model", "tiny-llama", "--problems", "3", "--threads", "1,1", "--batch-size", "2",
                "--json", str(out)])
    printed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in printed] == ["plain", "greedy_eval"]  # a repeated thread count runs once
    assert "3/3 answers identical" in printed[1] and "x in CPU)" in printed[1] and ", load " in printed[1]
    result = json.loads(out.read_text())
    assert (result["model"], result["problems"]) == ("tiny-llama", 3) and result["answer_tokens"] > 0
    plain, batched = result["runs"]["plain"], result["runs"]["batched-1"]
    assert set(plain) == {"threads", "wall_s", "cpu_s", "tokens_per_s", "load"}
    assert (batched["identical"], batched["batch_size"], batched["threads"]) == (3, 2, 1)
    assert batched["speedup"] == pytest.approx(plain["wall_s"] / batched["wall_s"])
    assert batched["cpu_speedup"] == pytest.approx(plain["cpu_s"] / batched["cpu_s"])


@pytest.mark.parametrize("argv, named", [
    (["--batch-size", "0"], "--batch-size must be >= 1, got 0"),
    (["--problems", "-1"], "--problems must be >= 1, got -1"),
    (["--threads", "1,x"], "--threads must be comma-separated counts >= 1, got '1,x'"),
    (["--threads", "0"], "--threads must be comma-separated counts >= 1, got '0'"),
])
def test_a_bad_value_exits_2_naming_it(bench, capsys, argv, named):
    with pytest.raises(SystemExit) as exc:
        bench.main(argv)
    assert exc.value.code == 2 and named in capsys.readouterr().err
