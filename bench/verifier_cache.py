"""The math-verify verdict cache on one coordinator round's worker-bound answers, before vs after.

    OMP_NUM_THREADS=1 .venv/bin/python bench/verifier_cache.py --labs 64 [--out FILE.json]

Builds the answers of one round of `bench/coordinator_scale.py` (the same generator: `labs` labs x
125 GSM8K prompts x G=8, 35 % correct, 2 % with a non-plain answer such as `\\$72`), keeps the
pairs the numeric fast path cannot decide (those that reach the sandboxed worker, ~1,300 at 64
labs), and re-verifies them three ways in one process, each on a fresh verifier whose worker is
started before the clock:

  before       cache off (`verdict_cache_entries=0`), one `verify` per item: one round trip each
  verify       the default cache, one `verify` per item (how the coordinator's validation calls it)
  verify_many  the default cache, one `verify_many` call (misses de-duplicated within the call)

`--repeats` times each, in rotating order (the machine's load moves the worker's time a lot), and
checks that every pass gives the same verdicts. Wall seconds, and CPU seconds of this process and
of the worker (steadier than wall time on a shared machine), medians over the passes, with the
load average at the start of each pass.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from coordinator_scale_labs import synthetic_response  # the scale bench's own generator

from hacfed.data import GSM8K_DIR
from hacfed.tasks.base import Verdict
from hacfed.tasks.math_data import answer_extractor
from hacfed.tasks.math_verifier import MathVerifier, MathVerifierConfig


def round_pairs(labs: int, prompts: int, group_size: int, seed: int) -> tuple[list[tuple[str, str]], int]:
    """(gold, response) of one round's trajectories that only the worker can decide, in lab order,
    and how many distinct worker requests (gold, extracted answer) they make."""
    rng = random.Random(seed)
    problems = [json.loads(line) for line in (GSM8K_DIR / "train.jsonl").read_text().splitlines()]
    chosen = rng.sample(problems, prompts)
    extract = answer_extractor("gsm8k")
    golds = [extract(p["answer"]) for p in chosen]
    solutions = [p["answer"].rsplit("####", 1)[0] + "The final answer is" for p in chosen]
    screen = MathVerifier()  # only its in-process steps are used: it never starts a worker
    pairs, requests = [], set()
    for _ in range(labs):
        for gold, solution in zip(golds, solutions):
            for _ in range(group_size):
                correct = rng.random() < 0.35
                text = synthetic_response(rng, solution, gold, correct, rng.random() < 0.02)
                request = screen._screen(gold, text)
                if not isinstance(request, Verdict):
                    pairs.append((gold, text))
                    requests.add(request)
    assert screen.worker_starts == 0
    return pairs, len(requests)


def worker_cpu_s(verifier: MathVerifier) -> float:
    """CPU seconds the verifier's live worker process has used (Linux /proc)."""
    pid = verifier._worker.pid
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def timed(pairs: list[tuple[str, str]], cache_entries: int, many: bool) -> tuple[dict[str, Any], list[Verdict]]:
    """One pass over `pairs` on a fresh verifier (its worker started and warmed off the clock)."""
    with MathVerifier(MathVerifierConfig(verdict_cache_entries=cache_entries)) as verifier:
        assert verifier.verify("2", "\\boxed{1+1}").reward == 1.0
        calls, load = verifier.worker_calls, os.getloadavg()[0]
        wall, cpu, worker = time.perf_counter(), time.process_time(), worker_cpu_s(verifier)
        verdicts = verifier.verify_many(pairs) if many else [verifier.verify(g, r) for g, r in pairs]
        worker = worker_cpu_s(verifier) - worker
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        assert verifier.worker_starts == 1, "a worker was replaced mid-pass: its CPU time is lost"
        row = {"worker_calls": verifier.worker_calls - calls, "wall_s": wall, "cpu_s": cpu, "worker_cpu_s": worker,
               "load_1min": load}
    return row, verdicts


MODES = {"before": (0, False), "verify": (MathVerifierConfig().verdict_cache_entries, False),
         "verify_many": (MathVerifierConfig().verdict_cache_entries, True)}


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--labs", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="passes per mode, in rotating order; medians reported")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    pairs, distinct = round_pairs(args.labs, 125, 8, args.seed)
    print(f"{args.labs} labs: {len(pairs)} worker-bound items, {distinct} distinct (gold, answer)")
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    reference: list[Verdict] | None = None
    names = list(MODES)
    for rep in range(args.repeats):
        for mode in names[rep % 3:] + names[: rep % 3]:
            row, verdicts = timed(pairs, *MODES[mode])
            reference = verdicts if reference is None else reference
            if verdicts != reference:
                raise SystemExit(f"{mode}: verdicts differ from the first pass's")
            runs[mode].append(row)
            print(f"  {mode:>11}: {row['worker_calls']} worker calls, {row['wall_s']:.2f} s wall, "
                  f"{row['cpu_s']:.2f} s CPU here + {row['worker_cpu_s']:.2f} s in the worker, "
                  f"load {row['load_1min']:.2f}", flush=True)
    keys = ("worker_calls", "wall_s", "cpu_s", "worker_cpu_s")
    summary = {mode: {key: statistics.median(r[key] for r in rows) for key in keys}
               for mode, rows in runs.items()}
    for mode, med in summary.items():
        med["wall_ratio_vs_before"] = summary["before"]["wall_s"] / med["wall_s"]
        cpu = med["cpu_s"] + med["worker_cpu_s"]
        med["cpu_ratio_vs_before"] = (summary["before"]["cpu_s"] + summary["before"]["worker_cpu_s"]) / cpu
        print(f"median {mode:>11}: {med['worker_calls']:.0f} worker calls, {med['wall_s']:.2f} s wall "
              f"(x{med['wall_ratio_vs_before']:.2f} vs before), {cpu:.2f} s CPU with the worker "
              f"(x{med['cpu_ratio_vs_before']:.2f})")
    if args.out:
        report = {"labs": args.labs, "worker_items": len(pairs), "distinct_requests": distinct,
                  "load_avg_at_end": os.getloadavg(), "median": summary, "runs": runs}
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
