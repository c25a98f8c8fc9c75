"""Atheris runs of the structure-aware target (security.md S4): a 15 s smoke run by default, 10^6
executions in the long tier (`./scripts/test.sh --long`).

`tests/faults/fuzz_structured.py` mutates protobuf messages field by field instead of bytes (its
docstring says how). It runs here as its own process, in its own process group, with its corpus,
crash artifacts and output in the test's temporary directory (the helpers of
test_fuzz_decoders.py). A second run plants a bug that only a boundary value in one field of a
valid, signed submission reaches (a sample claiming 2^32 - 1 tokens, which the decoder accepts and
validation refuses), and must end in a crash report: the mutator reaches a value behind the decoder
that the byte-level fuzz_decoders.py did not reach in 817,823 executions (docs/security.md, "Fuzzing").
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from tests.faults.test_fuzz_decoders import LONG_LIMIT_S, LONG_RUNS, MARGIN_S, _libfuzzer_args, _run, fuzz_clean

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("atheris") is None,
                       reason="atheris is not installed: it is in the `test` extra for Linux x86_64 only "
                              "(pip install 'atheris>=3.0,<4')"),
]

TARGET = Path(__file__).with_name("fuzz_structured.py")


@pytest.mark.parametrize(("budget", "limit_s", "min_runs"), [
    pytest.param("-max_total_time=15", 15 + MARGIN_S, 500, id="15s"),  # the smoke run
    pytest.param(f"-runs={LONG_RUNS}", LONG_LIMIT_S, LONG_RUNS, id="1e6-runs",
                 marks=[pytest.mark.long, pytest.mark.timeout(LONG_LIMIT_S + 300)]),
])
def test_structured_fuzzing_run_finds_nothing(tmp_path: Path, budget: str, limit_s: float, min_runs: int) -> None:
    runs, seconds = fuzz_clean(TARGET, budget, tmp_path, limit_s, min_runs)
    print(f"\nstructured atheris run: {runs} executions in {seconds}s ({runs / max(seconds, 1):.0f}/s), "
          f"corpus {len(list((tmp_path / 'corpus').iterdir()))} inputs")


PLANTED = """
import sys
sys.path.insert(0, {folder!r})
import fuzz_structured as target

judge = target.base._judge

def planted(sub):
    if any(t.source_token_count == 2**32 - 1 for t in sub.trajectories):
        raise RuntimeError("planted: a boundary token count reached validation")
    judge(sub)

target.base._judge = planted
target.fill_corpus(target.Path(sys.argv[-1]))
target.atheris.Setup(sys.argv, target.test_one_input, custom_mutator=target.mutate)
target.atheris.Fuzz()
"""


def test_the_structured_run_reaches_a_boundary_value_behind_the_signature(tmp_path: Path) -> None:
    script = tmp_path / "planted.py"
    script.write_text(PLANTED.format(folder=str(TARGET.parent)))
    argv = [sys.executable, str(script), "-max_total_time=120", "-runs=1000000", *_libfuzzer_args(tmp_path)]
    rc, out = _run(argv, tmp_path, 120 + MARGIN_S)
    assert rc != 0 and "planted: a boundary token count" in out, out[-3000:]
    assert any(p.name.startswith("crash-") for p in tmp_path.iterdir())
    counts = re.findall(r"^#(\d+)\s", out[: out.find("planted: a boundary")], re.MULTILINE)
    print(f"\nplanted bug found after about {counts[-1] if counts else '?'} executions")
