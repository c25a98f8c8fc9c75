"""bench/skill_transfer.py refuses bad input with a message naming it, never a traceback."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "skill_transfer.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("skill_transfer_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("flag, value", [("--lr", "0"), ("--lr", "nan"), ("--lr", "inf"), ("--steps", "-1"),
                                         ("--batch", "0"), ("--problems", "0")])
def test_bad_numbers_are_refused_naming_the_flag(bench, capsys, flag, value):
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args([flag, value])
    assert exit_info.value.code == 2
    assert f"{flag} must be a finite number > 0" in capsys.readouterr().err


def test_an_unknown_model_is_an_error_not_a_traceback(bench, capsys):
    assert bench.main(["--model", "no-such-model", "--steps", "1"]) == 2
    assert "unknown model 'no-such-model'" in capsys.readouterr().err
