"""The fast lab's idle share over real Flower: round_join "newest" beside the synchronous schedule.

    OMP_NUM_THREADS=1 .venv/bin/python bench/round_join_flower.py --rounds 4 --join-rounds 12 --max-staleness 5

Runs hacfed-server and two hacfed-client processes (tiny-llama, lab-b at `--slowdown 4`) on loopback
twice, one run after the other: the synchronous schedule (max_staleness 0, round_join "every",
`--rounds` rounds) and round_join "newest" at `--max-staleness` K (`--join-rounds` rounds), with the
same arithmetic plan (docs/staleness.md "Joining the newest round"). The plan is large enough
(`--prompts` x `--group-size` answers of `--max-new-tokens` tokens) that a step's compute outweighs
an exchange's latency, which counts as idle; K is above the speed ratio, so the fast lab's next round
rarely waits for the slow lab's round n - K to close (at K = 3 and a ratio of 4 it does, seconds at a time).
From each run's journal:

    idle share of lab-a = 1 - (its reported compute: rollout + training + eval + checkpoint seconds of
                               every round it took) / (from round 0's opening to its last submission)

that is, the share of its time lab-a spent waiting, for the coordinator or for the transport (its
exchanges' latency counts as waiting). Also printed: the rounds each lab took and the wall time until
lab-a's last submission. The labs share the machine's cores, so a slow machine raises both runs' compute.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
TOML = """
run_id = "bench-join"
rounds = {rounds}
max_staleness = {k}
round_join = "{join}"
prompts_per_round = {prompts}
group_size = {group_size}
expected_participants = 2
min_participants = 2
round_deadline_s = 900
eval_every = 0
state_dir = "server"
[task]
kind = "arithmetic"
digits = 2
operators = "+"
[sampling]
max_new_tokens = {max_new_tokens}
"""


def _start(argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=log.parent,
                                start_new_session=True)


def _wait_for(log: Path, pattern: str, proc: subprocess.Popen, timeout: float = 300.0) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        match = re.search(pattern, log.read_text(errors="replace") if log.exists() else "")
        if match:
            return match
        if proc.poll() is not None:
            raise RuntimeError(f"{log.name}: exited {proc.returncode} before /{pattern}/")
        time.sleep(0.2)
    raise RuntimeError(f"{log.name}: no /{pattern}/ within {timeout:.0f}s")


def run_pair(tmp: Path, rounds: int, k: int, join: str, args: argparse.Namespace) -> Path:
    """One federation to its end; returns its journal."""
    model, factor = args.model, args.slowdown
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    (tmp / "coordinator.toml").write_text(TOML.format(rounds=rounds, k=k, join=join, prompts=args.prompts,
                                                      group_size=args.group_size,
                                                      max_new_tokens=args.max_new_tokens))
    server_dir = tmp / "server"
    procs: list[subprocess.Popen] = []
    try:
        server = _start([str(BIN / "hacfed-server"), "--config", str(tmp / "coordinator.toml"), "--insecure",
                         "--listen", "127.0.0.1:0", "--state-dir", str(server_dir)], tmp / "server.log", env)
        procs.append(server)
        address = _wait_for(tmp / "server.log", r"hacfed-server: ready: Fleet API on (127\.0\.0\.1:\d+)", server)[1]
        for pid, extra in (("lab-a", []), ("lab-b", ["--slowdown", str(factor)])):
            procs.append(_start([str(BIN / "hacfed-client"), "--model", model, "--server", address,
                                 "--participant-id", pid, "--state-dir", str(tmp / pid), "--coordinator-key",
                                 str(server_dir / "coordinator.pub"), "--insecure", "--eval-problems", "4", *extra],
                                tmp / f"{pid}.log", env))
            key = tmp / pid / "participant.pub"
            while not key.exists():
                if procs[-1].poll() is not None:
                    raise RuntimeError(f"{pid} exited: {(tmp / f'{pid}.log').read_text()[-3000:]}")
                time.sleep(0.1)
            shutil.copy(key, server_dir / "keys" / f"{pid}.pub")  # the operator registers the lab
        if server.wait(timeout=3600) != 0:
            raise RuntimeError(f"hacfed-server failed: {(tmp / 'server.log').read_text()[-3000:]}")
        for proc in procs[1:]:
            proc.wait(timeout=300)
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=60)
    return server_dir / "journal.sqlite"


def idle_share(journal: Path, lab: str, rounds: int) -> dict[str, object]:
    """lab's idle share, wall time and rounds taken, read from a finished run's journal (module docstring)."""
    with sqlite3.connect(f"file:{journal}?mode=ro", uri=True) as db:
        opened = db.execute("SELECT opened_at FROM rounds WHERE round_id=0").fetchone()[0]
        taken = {p: [q for (q,) in db.execute("SELECT round_id FROM submissions WHERE participant_id=? "
                                                "ORDER BY round_id", (p,))] for p in ("lab-a", "lab-b")}
        last = db.execute("SELECT MAX(received_at) FROM submissions WHERE participant_id=?", (lab,)).fetchone()[0]
        compute = 0.0
        for (report,) in db.execute("SELECT report_json FROM metrics WHERE participant_id=? AND round_id<?",
                                    (lab, rounds)):
            metrics = json.loads(report).get("metrics", {})
            compute += sum(float(metrics.get(f"time_{part}_s", 0.0))
                           for part in ("rollout", "training", "eval", "checkpoint"))
    span = last - opened
    return {"idle_share": round(1.0 - compute / span, 3), "wall_s": round(span, 1), "compute_s": round(compute, 1),
            "rounds_taken": {p: len(q) for p, q in taken.items()}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=4, help="rounds of the synchronous run (default 4)")
    p.add_argument("--join-rounds", type=int, default=12, help="rounds of the round_join newest run (default 12)")
    p.add_argument("--max-staleness", type=int, default=5, help="K of the newest run (default 5)")
    p.add_argument("--slowdown", type=float, default=4.0, help="lab-b's --slowdown (default 4)")
    p.add_argument("--model", default="tiny-llama")
    p.add_argument("--prompts", type=int, default=32, help="prompts per round (default 32)")
    p.add_argument("--group-size", type=int, default=8, help="G (default 8)")
    p.add_argument("--max-new-tokens", type=int, default=32, help="tokens per answer (default 32)")
    args = p.parse_args()
    out = {}
    for name, rounds, k, join in (("sync", args.rounds, 0, "every"),
                                  ("newest", args.join_rounds, args.max_staleness, "newest")):
        with tempfile.TemporaryDirectory(prefix="hacfed-bench-join-") as tmp:
            journal = run_pair(Path(tmp), rounds, k, join, args)
            out[name] = {"rounds": rounds, "max_staleness": k, **idle_share(journal, "lab-a", rounds)}
        print(f"{name}: {json.dumps(out[name])}", flush=True)
    print(json.dumps({"slowdown": args.slowdown, "model": args.model, "prompts": args.prompts,
                      "group_size": args.group_size, "max_new_tokens": args.max_new_tokens, **out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
