"""Greedy held-out evaluation: the batched evaluator against `generate(greedy=True)`, side by side.

    python bench/greedy_eval_speed.py --model smollm2 --problems 500 --json runs/greedy_eval.json

Both evaluate the same add2-words test problems with the same model in this process: first the
plain loop (`hacfed.rollout.hf.generate(..., greedy=True, batch_size=128)`, the evaluator before
`hacfed.rollout.greedy_eval`) on `--baseline-threads` torch threads, then `greedy_eval.greedy_generate`
on each count of `--threads` (default: 1 and every core), `--batch-size` rows decoded together.
Printed: wall and CPU seconds, answer tokens per wall second, the speed-up over the plain loop in
wall and in CPU time, and how many answers are identical (text, token ids and finish reason), with
the machine's 1-minute load average at each run's start and end: the machine's other load moves
wall times (on a busy machine read the CPU ratio, at one thread each); the ratios are of runs
measured one after the other in one process.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Sequence


def timed(fn):
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - t0, time.process_time() - c0


def load() -> str:
    """The 1-minute load average, to state what else ran."""
    return f"{os.getloadavg()[0]:.1f}"


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[int]]:
    """The arguments and the thread counts to run greedy_eval on; a bad value exits 2 naming it."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--problems", type=int, default=500)
    parser.add_argument("--baseline-threads", type=int, default=1)
    parser.add_argument("--threads", default=f"1,{os.cpu_count() or 1}", help="comma-separated thread counts")
    parser.add_argument("--batch-size", type=int, default=64, help="greedy_eval's rows decoded together (default 64)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    for name in ("problems", "baseline_threads", "batch_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    try:
        threads = list(dict.fromkeys(int(t) for t in args.threads.split(",")))
    except ValueError:
        threads = []
    if not threads or min(threads) < 1:
        parser.error(f"--threads must be comma-separated counts >= 1, got {args.threads!r}")
    return args, threads


def main(argv: Sequence[str] | None = None) -> None:
    args, thread_counts = parse_args(argv)

    import torch

    from hacfed.models.loading import load_model
    from hacfed.rollout.greedy_eval import greedy_generate
    from hacfed.rollout.hf import generate
    from hacfed.tasks.registry import load_task

    loaded = load_model(args.model, progress=False)
    task = load_task({"kind": "arithmetic", "digits": 2, "operators": "+", "num_eval": args.problems,
                      "style": "words"})
    prompts = [p.messages for p in list(task.eval_problems())[:args.problems]]
    budget = task.max_new_tokens
    torch.set_num_threads(args.baseline_threads)
    before = load()
    groups, wall, cpu = timed(lambda: generate(loaded.model, loaded.tokenizer, prompts, greedy=True,
                                                max_new_tokens=budget, batch_size=128))
    want = [g[0] for g in groups]
    tokens = sum(len(c.token_ids) for c in want)
    rows = {"plain": {"threads": args.baseline_threads, "wall_s": wall, "cpu_s": cpu, "tokens_per_s": tokens / wall,
                      "load": f"{before}-{load()}"}}
    print(f"plain loop      {args.baseline_threads} thread(s): {wall:7.1f} s wall, {cpu:7.1f} s CPU, "
          f"{tokens / wall:6.1f} answer tokens/s, load {rows['plain']['load']}", flush=True)
    for threads in thread_counts:
        torch.set_num_threads(threads)
        before = load()
        got, wall, cpu = timed(lambda: greedy_generate(loaded.model, loaded.tokenizer, prompts, max_new_tokens=budget,
                                                       batch_size=args.batch_size))
        same = sum(g.text == w.text and g.token_ids == w.token_ids and g.finish_reason == w.finish_reason
                   for g, w in zip(got, want))
        speedup, cpu_speedup = rows["plain"]["wall_s"] / wall, rows["plain"]["cpu_s"] / cpu
        rows[f"batched-{threads}"] = {"threads": threads, "wall_s": wall, "cpu_s": cpu, "tokens_per_s": tokens / wall,
                                      "speedup": speedup, "cpu_speedup": cpu_speedup, "identical": same,
                                      "batch_size": args.batch_size, "load": f"{before}-{load()}"}
        print(f"greedy_eval     {threads} thread(s): {wall:7.1f} s wall, {cpu:7.1f} s CPU, "
              f"{tokens / wall:6.1f} answer tokens/s, {speedup:.2f}x the plain loop ({cpu_speedup:.2f}x in CPU), "
              f"{same}/{len(prompts)} answers identical, load {rows[f'batched-{threads}']['load']}", flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"model": args.model, "problems": len(prompts), "answer_tokens": tokens,
                                               "runs": rows}, indent=1))


if __name__ == "__main__":
    main()
