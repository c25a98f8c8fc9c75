"""How does a chat model do on the words-style arithmetic task? The measurement behind its variant and budget.

    OMP_NUM_THREADS=1 python bench/arith_words.py --model smollm2 --variants add2,addsub2,addmul1 --budget 48

For each variant (digits and operators of `ArithmeticTask(style="words")`), answers the first
`--problems` validation problems greedily (as evaluation does) and once sampled at temperature 1
(as rollouts do), and prints one JSON line per pass: accuracy under the task's verifier (last
integer), mean and largest answer length in tokens, the fraction cut at the budget, the wall time,
and three example answers.
"""

from __future__ import annotations

import argparse
import json
import time

# name -> ArithmeticTask options; "add2" is `hacfed sim --task add2-words` (the same validation split).
VARIANTS = {
    "add2": {"digits": 2, "operators": "+", "num_eval": 500, "num_validation": 200},
    "addsub2": {"digits": 2, "operators": "+-", "num_eval": 500, "num_validation": 200},
    "addmul1": {"digits": 1, "operators": "+*", "num_train": 40, "num_eval": 12, "num_validation": 48},  # of 200
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--variants", default="add2,addsub2,addmul1", help=f"comma-separated, of {sorted(VARIANTS)}")
    parser.add_argument("--problems", type=int, default=48)
    parser.add_argument("--budget", type=int, default=48)
    parser.add_argument("--batch-size", type=int, default=24)
    args = parser.parse_args()

    from hacfed.models.loading import load_model
    from hacfed.rollout.hf import generate
    from hacfed.tasks.registry import load_task

    loaded = load_model(args.model, progress=False)
    for name in args.variants.split(","):
        task = load_task({"kind": "arithmetic", "style": "words", **VARIANTS[name]})
        problems = list(task.validation_problems())[: args.problems]
        for greedy in (True, False):
            t0 = time.perf_counter()
            groups = generate(loaded.model, loaded.tokenizer, [p.messages for p in problems], num_samples=1,
                              max_new_tokens=args.budget, greedy=greedy, batch_size=args.batch_size, seed=0)
            seconds = time.perf_counter() - t0
            answers = [g[0] for g in groups]
            rewards = [task.verify(p, c.text).reward for p, c in zip(problems, answers)]
            lengths = [len(c.token_ids) for c in answers]
            print(json.dumps({
                "model": args.model, "variant": name, "greedy": greedy, "budget": args.budget,
                "problems": len(problems), "accuracy": round(sum(rewards) / len(rewards), 3),
                "mean_tokens": round(sum(lengths) / len(lengths), 1), "max_tokens": max(lengths),
                "cut_at_budget": round(sum(c.finish_reason == "length" for c in answers) / len(answers), 3),
                "generate_s": round(seconds, 1), "examples": [c.text for c in answers[:3]],
            }), flush=True)


if __name__ == "__main__":
    main()
