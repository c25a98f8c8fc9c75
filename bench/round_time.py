"""Round time through real Flower processes vs the in-process federation, same agents and seed.

    OMP_NUM_THREADS=1 .venv/bin/python bench/round_time.py --rounds 6 --agents tiny-llama,tiny-gpt2

Runs `hacfed sim` (direct calls, agents one after the other in one process) and `hacfed demo`
(hacfed-server + one hacfed-client process per agent on loopback, labs computing in parallel) with
the same plan settings, and reports the median round wall time of each and their ratio, plus the
Flower run's split into rollout / training / eval / exchange / coordinator. Round 0 (no training)
and the last round are included; the final evaluation is not.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def in_process(agents: list[str], rounds: int, prompts: int, group: int, seed: int) -> list[float]:
    from hacfed.sim import SimConfig, run_sim

    stamps: dict[int, float] = {}

    def on_row(row: dict) -> None:
        if not row.get("final"):
            stamps.setdefault(row["round"], time.perf_counter())

    cfg = SimConfig(agents=tuple(agents), rounds=rounds, seed=seed, prompts_per_round=prompts, group_size=group,
                    eval_every=0, learning_rate=5e-5)
    run_sim(cfg, None, progress=False, on_row=on_row)
    # rows of round r are emitted when round r closes; round 0 also pays model loading, so it is
    # measured from the first close only (rounds 1..R-1).
    ordered = [stamps[r] for r in sorted(stamps)]
    return [b - a for a, b in zip(ordered, ordered[1:])]


def through_flower(agents: list[str], rounds: int, prompts: int, group: int, seed: int) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="hacfed-bench-") as tmp:
        metrics = Path(tmp) / "metrics.jsonl"
        cmd = [str(Path(sys.executable).parent / "hacfed"), "demo", "--agents", ",".join(agents),
               "--rounds", str(rounds), "--prompts-per-round", str(prompts), "--group-size", str(group),
               "--eval-every", "0", "--seed", str(seed), "--metrics-out", str(metrics),
               "--plot", str(Path(tmp) / "plot.png")]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, start_new_session=True, env=dict(os.environ))
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return [r for r in rows if not r.get("final")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", default="tiny-llama,tiny-gpt2")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--prompts-per-round", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    agents = [a for a in args.agents.split(",") if a]
    local = in_process(agents, args.rounds, args.prompts_per_round, args.group_size, args.seed)
    rows = through_flower(agents, args.rounds, args.prompts_per_round, args.group_size, args.seed)
    by_round: dict[int, list[dict]] = {}
    for r in rows:
        by_round.setdefault(r["round"], []).append(r)
    flower = [group[0]["time_round_s"] for rnd, group in sorted(by_round.items()) if rnd > 0]
    local_median, flower_median = statistics.median(local), statistics.median(flower)
    print(f"agents {agents}, {args.prompts_per_round} prompts x G={args.group_size}, rounds 1..{args.rounds - 1}")
    print(f"in-process median round: {local_median:.2f} s  (rounds: {', '.join(f'{x:.2f}' for x in local)})")
    print(f"Flower     median round: {flower_median:.2f} s  (rounds: {', '.join(f'{x:.2f}' for x in flower)})")
    print(f"ratio Flower / in-process: {flower_median / local_median:.2f}x")
    parts = ("rollout", "training", "eval", "exchange", "coordinator")
    for part in parts:
        values = [r[f"time_{part}_s"] for r in rows if r["round"] > 0 and f"time_{part}_s" in r]
        if values:
            print(f"  Flower {part:<11} median {statistics.median(values):.2f} s per lab and round")
    return 0


if __name__ == "__main__":
    sys.exit(main())
