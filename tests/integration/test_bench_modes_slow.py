"""`hacfed bench modes` for real on bench/smoke.toml: runs, Ctrl-C, resume, report (~1 min on 2 cores).

Real `hacfed sim` children on the tiny add2 agents (built on first use under HACFED_HOME, like
scripts/test.sh sets it). Checks that one setting can run alone, that Ctrl-C stops every child and
exits non-zero, that the next start skips complete runs and reruns the rest, and that the report's
numbers are the ones in the metrics files.
"""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _running_with(text: str) -> list[int]:
    """Pids of live processes whose command line mentions `text`."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if text in cmdline and state != "Z":
                pids.append(int(entry.name))
    return pids


def _final_accuracy(path: Path, agent: str) -> float:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return next(r["eval_accuracy"] for r in rows if r["agent"] == agent and r.get("final"))


def test_smoke_matrix_runs_resumes_after_ctrl_c_and_reports(tmp_path, zoo_presets):
    zoo_presets("tiny-llama", "tiny-gpt2")  # bench/smoke.toml's agents, built side by side
    out, results, img = tmp_path / "runs", tmp_path / "results.md", tmp_path / "img"
    env = {**os.environ, "HACFED_HOME": os.environ.get("HACFED_HOME", str(ROOT / ".hacfed-home")),
           "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "hacfed.tools.cli", "bench", "modes",
               "--matrix", str(ROOT / "bench" / "smoke.toml"),
               "--out", str(out), "--results", str(results), "--img-dir", str(img), "--jobs", "2"]

    # 1. one setting alone
    first = subprocess.run([*command, "--only", "pair"], env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stdout + first.stderr
    assert len(list((out / "pair").rglob("seed-*.jsonl"))) == 4 and not (out / "pair-fast").exists()
    text = results.read_text()
    assert "Complete runs: 4 of 4." in text and "Complete runs: 0 of 4." in text

    # 2. the whole matrix, interrupted (Ctrl-C) once a run of the second setting has started
    # SIGINT back to its default: a backgrounded test runner can pass it down as ignored, and Python
    # then never raises KeyboardInterrupt.
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not _running_with(str(out / "pair-fast")):
        assert proc.poll() is None and time.monotonic() < deadline, "no pair-fast run started"
        time.sleep(0.1)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, output
    assert "interrupted" in output
    assert _running_with(str(out)) == [], "a sim child survived Ctrl-C"
    complete_fast = len(list((out / "pair-fast").rglob("seed-*.jsonl")))
    assert complete_fast < 4

    # 3. the same command again: complete runs are skipped, the rest runs
    third = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert third.returncode == 0, third.stdout + third.stderr
    assert f"{4 + complete_fast} of 8 runs already complete" in third.stdout
    assert third.stdout.count(" start ") == 4 - complete_fast
    assert len(list(out.rglob("seed-*.jsonl"))) == 8 and not list(out.rglob("*.partial"))

    text = results.read_text()
    assert text.count("Complete runs: 4 of 4.") == 2 and "pair-fast vs pair" in text
    for name in ("pair", "pair-fast"):
        assert (img / f"modes-{name}.png").stat().st_size > 5000
        assert f"![learning curves of {name}](img/modes-{name}.png)" in text
    # the report's cell is the mean over the two seeds' final rows, with the t(1) interval
    values = [_final_accuracy(out / "pair" / "naive" / f"seed-{s}.jsonl", "tiny-llama") for s in (0, 1)]
    half = 12.7062 * statistics.stdev(values) / 2 ** 0.5
    pair = text.split("### pair:", 1)[1].split("### pair-fast", 1)[0]
    assert re.search(rf"\| naive \| 16 \| {statistics.mean(values):.3f} ± {half:.3f} \(n=2\) \|", pair), pair
