"""Atheris runs of the envelope and payload decoders (security.md S4): a 15 s smoke run by default,
10^6 executions in the long tier (`./scripts/test.sh --long`).

`tests/faults/fuzz_decoders.py` is the target (what it checks, and how to run it for longer, is in
its docstring and in docs/security.md). It runs here as its own process, in its own process group,
with its corpus, crash artifacts and output in the test's temporary directory; a run that outlives
its time plus a generous margin is killed by its process group id and fails. A second run plants a
bug in one decoder and must end in the crash report the smoke run would then show, so the smoke
run can fail.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("atheris") is None,
                       reason="atheris is not installed: it is in the `test` extra for Linux x86_64 only "
                              "(pip install 'atheris>=3.0,<4')"),
]

TARGET = Path(__file__).with_name("fuzz_decoders.py")
MARGIN_S = 300  # start-up and instrumentation on a slow, busy machine; far below pytest's timeout
# 10^6 executions took 560 s on 2 busy cores (docs/security.md): the limit leaves 4x for a slower machine.
LONG_RUNS = 1_000_000
LONG_LIMIT_S = 2400


def _run(argv: list[str], cwd: Path, limit_s: float) -> tuple[int, str]:
    """argv in its own process group; killed (the whole group, by its id) if it runs past limit_s."""
    log = cwd / "fuzz.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            rc = proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            tail = log.read_text(errors="replace")[-3000:]
            pytest.fail(f"the fuzzer ran past {limit_s:.0f}s and was killed:\n{tail}")
    return rc, log.read_text(errors="replace")


def _libfuzzer_args(tmp_path: Path, *extra: str) -> list[str]:
    return [f"-artifact_prefix={tmp_path}/", "-timeout=20", "-rss_limit_mb=2048", "-print_final_stats=1",
            *extra, str(tmp_path / "corpus")]


def fuzz_clean(target: Path, budget: str, tmp_path: Path, limit_s: float, min_runs: int) -> tuple[int, int]:
    """Run an atheris target for `budget`; assert it found nothing and ran at least min_runs inputs.
    Returns (executions, seconds)."""
    rc, out = _run([sys.executable, str(target), budget, *_libfuzzer_args(tmp_path)], tmp_path, limit_s)
    crashes = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("crash-", "timeout-", "oom-")))
    assert rc == 0 and not crashes, f"exit {rc}, artifacts {crashes}:\n{out[-5000:]}"
    assert "Uncaught Python exception" not in out and "==ERROR" not in out, out[-5000:]
    done = re.search(r"Done (\d+) runs in (\d+) second", out)
    assert done, out[-3000:]
    runs, seconds = int(done.group(1)), int(done.group(2))
    assert runs >= min_runs, out[-3000:]
    return runs, seconds


@pytest.mark.parametrize(("budget", "limit_s", "min_runs"), [
    pytest.param("-max_total_time=15", 15 + MARGIN_S, 1000, id="15s"),  # the smoke run
    pytest.param(f"-runs={LONG_RUNS}", LONG_LIMIT_S, LONG_RUNS, id="1e6-runs",
                 marks=[pytest.mark.long, pytest.mark.timeout(LONG_LIMIT_S + 300)]),
])
def test_decoders_survive_a_fuzzing_run(tmp_path: Path, budget: str, limit_s: float, min_runs: int) -> None:
    runs, seconds = fuzz_clean(TARGET, budget, tmp_path, limit_s, min_runs)  # ~5,000 executions/s on 2 busy cores
    assert len(list((tmp_path / "corpus").iterdir())) >= 15  # the seeds, plus what the run added
    print(f"\natheris run: {runs} executions in {seconds}s ({runs / max(seconds, 1):.0f}/s), "
          f"corpus {len(list((tmp_path / 'corpus').iterdir()))} inputs")


PLANTED = """
import sys
sys.path.insert(0, {folder!r})
import fuzz_decoders as target

decode, encode = target.CODECS["error"]

def broken(data):
    result = decode(data)
    raise RuntimeError("planted: a decoder let a non-WireError escape")

target.CODECS["error"] = (broken, encode)
target.atheris.Setup(sys.argv, target.test_one_input)
target.fill_corpus(target.Path(sys.argv[-1]))
target.atheris.Fuzz()
"""


def test_the_smoke_run_reports_a_decoder_that_raises_anything_but_a_wire_error(tmp_path: Path) -> None:
    script = tmp_path / "planted.py"
    script.write_text(PLANTED.format(folder=str(TARGET.parent)))
    argv = [sys.executable, str(script), "-max_total_time=60", "-runs=200000", *_libfuzzer_args(tmp_path)]
    rc, out = _run(argv, tmp_path, 60 + MARGIN_S)
    assert rc != 0 and "Uncaught Python exception" in out and "planted: a decoder" in out, out[-3000:]
    assert any(p.name.startswith("crash-") for p in tmp_path.iterdir())  # the input, kept for a replay
