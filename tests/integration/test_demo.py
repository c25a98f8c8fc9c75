"""`hacfed demo` end to end: real processes, outputs written, nothing left running (also on Ctrl-C)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.slow

HACFED = str(Path(sys.executable).parent / "hacfed")
SMALL = ["--agents", "tiny-llama,tiny-gpt2", "--prompts-per-round", "2", "--group-size", "2", "--eval-every", "1"]


def _leftovers(state: Path) -> list[str]:
    """Live processes whose command line or environment (FLWR_HOME, ...) names the demo's state dir."""
    found = []
    for proc in psutil.process_iter(["status", "cmdline"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            cmd = " ".join(proc.info["cmdline"] or [])
            if str(state) in cmd or any(str(state) in v for v in proc.environ().values()):
                found.append(cmd[:120])
        except psutil.Error:
            continue
    return found


def test_demo_runs_writes_outputs_and_leaves_nothing(tmp_path):
    state, metrics, plot = tmp_path / "state", tmp_path / "m.jsonl", tmp_path / "acc.png"
    argv = [HACFED, "demo", *SMALL, "--rounds", "2", "--state-dir", str(state), "--metrics-out", str(metrics),
            "--plot", str(plot)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=900, start_new_session=True,
                            env=dict(os.environ))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "accuracy before" in result.stdout and "round 1" in result.stdout
    assert "[demo] tiny-llama ready" in result.stdout and "[demo] tiny-gpt2 ready" in result.stdout  # per agent
    # TLS and SuperNode authentication by default (README "Running a real federation"), set up in the state dir
    assert "Fleet API on 127.0.0.1:" in result.stdout and "(TLS, SuperNode authentication)" in result.stdout
    assert (state / "certs" / "ca.pem").exists() and (state / "coordinator" / "supernode-nodes.json").exists()
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert {(r["round"], r["agent"]) for r in rows if not r.get("final")} == {
        (r, a) for r in (0, 1) for a in ("lab-a-llama", "lab-b-gpt2")
    }
    assert all(isinstance(r["reward_mean"], float) for r in rows if not r.get("final"))
    assert {r["agent"] for r in rows if r.get("final") and "eval_accuracy" in r} == {"lab-a-llama", "lab-b-gpt2"}
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert result.stdout.strip().splitlines()[-1] == f"[demo] results: metrics {metrics}, plot {plot}, state {state}"
    time.sleep(1)
    assert _leftovers(state) == []

    # The same command again resumes the (complete) run in the state dir: it keeps writing the same
    # files instead of refusing them, and reprints none of the earlier run's lines.
    kept = metrics.read_text()
    again = subprocess.run(argv, capture_output=True, text=True, timeout=900, start_new_session=True,
                           env=dict(os.environ))
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"[demo] resuming the demo in {state}" in again.stdout and "already complete" in again.stdout
    assert "round 0" not in again.stdout and "Fleet API" not in again.stdout, again.stdout
    assert metrics.read_text() == kept
    time.sleep(1)
    assert _leftovers(state) == []


def test_demo_keeps_earlier_results_and_names_only_files_that_exist(tmp_path):
    """Default outputs in a folder that holds an earlier demo's: a fresh name; the temporary state dir
    is removed and the last line names only the results, which exist."""
    earlier = tmp_path / "runs" / "demo-metrics.jsonl"
    earlier.parent.mkdir()
    earlier.write_text('{"earlier": true}\n')
    result = subprocess.run([HACFED, "demo", *SMALL, "--rounds", "1"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=900, start_new_session=True, env=dict(os.environ))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert earlier.read_text() == '{"earlier": true}\n'
    metrics, plot = tmp_path / "runs" / "demo-2-metrics.jsonl", tmp_path / "runs" / "demo-2-accuracy.png"
    lines = result.stdout.strip().splitlines()
    assert lines[-1] == f"[demo] results: metrics {metrics}, plot {plot}", lines[-3:]
    assert lines[-2].startswith("[demo] removed the temporary state dir")
    assert metrics.stat().st_size > 0 and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    temporary = Path(re.search(r"\[demo\] state in (\S+);", result.stdout).group(1))
    assert not temporary.exists()
    time.sleep(1)
    assert _leftovers(temporary) == []


def test_demo_ctrl_c_stops_every_process(tmp_path):
    state = tmp_path / "state"
    demo = subprocess.Popen(
        [HACFED, "demo", *SMALL, "--rounds", "50", "--state-dir", str(state), "--metrics-out",
         str(tmp_path / "m.jsonl"), "--plot", str(tmp_path / "p.png")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        # A test runner started in the background inherits SIGINT as *ignored*, and so would the
        # demo; a user's Ctrl-C always arrives with the default disposition, so restore it.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    lines: list[str] = []
    # Keep draining the pipe: a demo blocked on a full stdout pipe could not react to Ctrl-C.
    reader = threading.Thread(target=lambda: lines.extend(iter(demo.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 600
        while not any("round 0" in line for line in lines) and demo.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        seen = "".join(lines)
        assert "round 0" in seen, seen[-3000:]
        assert _leftovers(state), "expected server and clients to be running"
        demo.send_signal(signal.SIGINT)
        demo.wait(timeout=300)
        assert demo.returncode == 130
        time.sleep(1)
        assert _leftovers(state) == []
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
