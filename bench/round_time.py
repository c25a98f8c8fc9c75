"""Round time through real Flower processes vs the in-process federation, same agents and seed.

    OMP_NUM_THREADS=1 .venv/bin/python bench/round_time.py --rounds 6 --agents tiny-llama,tiny-gpt2

Runs `hacfed sim` (direct calls, agents one after the other in one process) and `hacfed demo`
(hacfed-server + one hacfed-client process per agent on loopback, labs computing in parallel) with
the same plan settings, and reports the median round wall time of each and their ratio, plus the
Flower run's split into rollout / training / eval / exchange / coordinator. Round 0 (model loading)
is left out; the last round is included, the final evaluation is not. The in-process run goes
first and again last, and its median is over both (the CPU's speed may drift during the run).

`--isolation runner,subprocess` runs the Flower federation once per ClientApp mode, in the same run:
`runner` is hacfed's default (a resident ClientApp runner in each SuperNode,
`hacfed.clients.clientapp_runner`), `subprocess` is stock Flower's (a SuperExec starting a fresh
`flwr-clientapp` per message): the before/after of docs/results.md, "Round time over Flower".
`--baseline DIR` first runs each Flower federation once more with the hacfed package found on
PYTHONPATH=DIR (an export of an earlier commit, laid out as the installed package), labelled
"baseline", so a change to the transport is measured before and after in one run.
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
    from hacfed.tools.sim import SimConfig, run_sim

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


def through_flower(agents: list[str], rounds: int, prompts: int, group: int, seed: int,
                   isolation: str = "runner", pythonpath: str | None = None) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="hacfed-bench-") as tmp:
        metrics = Path(tmp) / "metrics.jsonl"
        cmd = [str(Path(sys.executable).parent / "hacfed"), "demo", "--agents", ",".join(agents),
               "--rounds", str(rounds), "--prompts-per-round", str(prompts), "--group-size", str(group),
               "--eval-every", "0", "--seed", str(seed), "--metrics-out", str(metrics),
               "--plot", str(Path(tmp) / "plot.png")]
        env = dict(os.environ, HACFED_CLIENTAPP_ISOLATION=isolation)
        if pythonpath is not None:
            env["PYTHONPATH"] = pythonpath
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, start_new_session=True, env=env)
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return [r for r in rows if not r.get("final")]


def main() -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--agents", default="tiny-llama,tiny-gpt2")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--prompts-per-round", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--isolation", default="runner",
                        help="comma-separated ClientApp modes to run through Flower, each once: runner (hacfed's "
                             "resident ClientApp runner, the default) and/or subprocess (stock Flower: a fresh "
                             "flwr-clientapp per message)")
    parser.add_argument("--baseline", metavar="DIR", default=None,
                        help="also run each Flower federation with the hacfed package on PYTHONPATH=DIR, first")
    args = parser.parse_args()
    agents = [a for a in args.agents.split(",") if a]
    modes = [m for m in args.isolation.split(",") if m]
    bad = [m for m in modes if m not in ("runner", "subprocess")]
    if bad or not modes:
        parser.error(f"--isolation takes runner and/or subprocess, got {args.isolation!r}")
    # The in-process federation runs before and after the Flower runs and its median is taken over both,
    # so a machine whose speed drifts during the run (a shared CPU) skews the ratios less.
    before = in_process(agents, args.rounds, args.prompts_per_round, args.group_size, args.seed)
    runs = [(f"baseline {mode}", mode, args.baseline) for mode in modes if args.baseline] + \
        [(mode, mode, None) for mode in modes]
    flower = {label: through_flower(agents, args.rounds, args.prompts_per_round, args.group_size, args.seed, mode,
                                    path) for label, mode, path in runs}
    after = in_process(agents, args.rounds, args.prompts_per_round, args.group_size, args.seed)
    local_median = statistics.median(before + after)
    print(f"agents {agents}, {args.prompts_per_round} prompts x G={args.group_size}, rounds 1..{args.rounds - 1}")
    print(f"in-process median round: {local_median:.2f} s  (rounds before: {', '.join(f'{x:.2f}' for x in before)}; "
          f"after: {', '.join(f'{x:.2f}' for x in after)})")
    for mode, rows in flower.items():
        report_flower(mode, rows, local_median)
    return 0


def report_flower(mode: str, rows: list[dict], local_median: float) -> None:
    by_round: dict[int, list[dict]] = {}
    for r in rows:
        by_round.setdefault(r["round"], []).append(r)
    flower = [group[0]["time_round_s"] for rnd, group in sorted(by_round.items()) if rnd > 0]
    flower_median = statistics.median(flower)
    print(f"Flower ({mode}) median round: {flower_median:.2f} s  (rounds: {', '.join(f'{x:.2f}' for x in flower)})")
    print(f"ratio Flower ({mode}) / in-process: {flower_median / local_median:.2f}x")
    parts = ("rollout", "training", "eval", "exchange", "coordinator")
    for part in parts:
        values = [r[f"time_{part}_s"] for r in rows if r["round"] > 0 and f"time_{part}_s" in r]
        if values:
            print(f"  Flower ({mode}) {part:<11} median {statistics.median(values):.2f} s per lab and round")


if __name__ == "__main__":
    sys.exit(main())
