"""How long are a model's answers? The measurement behind GSM8K's budget and the pretrained study's.

    OMP_NUM_THREADS=1 python bench/gsm8k_budget.py --model smollm2 --problems 48 --budget 1024

Samples one answer per validation question (the built-in gsm8k task's split and prompt, or
`--template`) at the federation's rollout settings (temperature 1, no top-k/top-p, the model's chat
template; `--temperature` to compare), or greedily (as evaluation does) with `--greedy`, then prints
the answer-length percentiles, the fraction each candidate budget would cut (answers still running
at `--budget` count as longer than every candidate), the accuracy under the task's verifier and the
wall time. `hacfed.tasks.math_data.GSM8K_PROMPT_TEMPLATE` and `GSM8K_MAX_NEW_TOKENS` were chosen
from this script's output for SmolLM2-135M-Instruct at temperature 1 (the comment there has the
numbers), e.g.

    OMP_NUM_THREADS=1 python bench/gsm8k_budget.py --problems 48 --budget 256 --batch-size 24 \
        --candidates 128,192,256

The pretrained study's temperature and budget (bench/pretrained_rules.toml, step 1):

    OMP_NUM_THREADS=1 python bench/gsm8k_budget.py --task add2-words --problems 48 --samples 4 \
        --budget 128 --temperature 0.5 --candidates 48,64,80,96
"""

from __future__ import annotations

import argparse
import json
import math
import time


def percentile(values: list[int], q: float) -> int:
    """The q-th percentile (nearest rank) of `values`."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--problems", type=int, default=48)
    parser.add_argument("--budget", type=int, default=1024)
    parser.add_argument("--greedy", action="store_true", help="greedy answers instead of temperature-1 samples")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--template", default=None, help="a prompt template with {question} (default: the task's)")
    parser.add_argument("--task", default="gsm8k", help="a `hacfed sim --task` name (default gsm8k)")
    parser.add_argument("--samples", type=int, default=1, help="answers per question (default 1)")
    parser.add_argument("--batch-size", type=int, default=48)
    parser.add_argument("--candidates", default="192,256,320,384,448,512")
    args = parser.parse_args()

    import torch

    from hacfed.models.loading import load_model
    from hacfed.rollout.hf import generate
    from hacfed.tasks.registry import load_task
    from hacfed.tools.sim import TASKS

    torch.manual_seed(0)
    if args.task not in TASKS:
        parser.error(f"--task {args.task!r}: expected one of {sorted(TASKS)}")
    task = load_task({**TASKS[args.task][0], **({"prompt_template": args.template} if args.template else {})})
    problems = [p for p in list(task.validation_problems())[: args.problems] for _ in range(args.samples)]
    t0 = time.perf_counter()
    loaded = load_model(args.model, progress=False)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    groups = generate(loaded.model, loaded.tokenizer, [p.messages for p in problems], num_samples=1,
                      max_new_tokens=args.budget, greedy=args.greedy,
                      temperature=args.temperature, batch_size=args.batch_size, seed=0)
    gen_s = time.perf_counter() - t0
    completions = [g[0] for g in groups]
    lengths = [len(c.token_ids) if c.finish_reason == "stop" else args.budget + 1 for c in completions]
    rewards = [task.verify(p, c.text).reward for p, c in zip(problems, completions)]
    result = {
        "model": args.model, "problems": len(problems), "budget": args.budget, "greedy": args.greedy,
        "temperature": args.temperature,
        "p50": percentile(lengths, 50), "p90": percentile(lengths, 90), "p95": percentile(lengths, 95),
        "cut_at_budget": sum(c.finish_reason == "length" for c in completions) / len(completions),
        "cut_at": {b: sum(n > b for n in lengths) / len(lengths) for b in map(int, args.candidates.split(","))},
        "accuracy": sum(rewards) / len(rewards), "load_s": round(load_s, 1), "generate_s": round(gen_s, 1),
    }
    print(json.dumps(result))
    task.close()


if __name__ == "__main__":
    main()
