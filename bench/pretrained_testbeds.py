"""Measure the pretrained testbeds: where SmolLM2 starts on each task, and how its partners compare.

    OMP_NUM_THREADS=1 python bench/pretrained_testbeds.py accuracy --models smollm2,smollm2-drilled --task add2-story
    OMP_NUM_THREADS=1 python bench/pretrained_testbeds.py story --problems 200 --samples 64 --budgets 64,96,128,160
    OMP_NUM_THREADS=1 python bench/pretrained_testbeds.py partners --partners tiny-qwen2-worked,tiny-llama-words

accuracy: each model's greedy accuracy (as evaluation scores it) on the first `--problems` problems of a
  task's validation split (`--task`, a `hacfed sim` task name), at `--budget` new tokens (default: the
  task's own budget, as `hacfed sim` uses it). A testbed's start band is this figure for `smollm2`.
story: SmolLM2 (`--model`) on add2-story's validation split, greedy (as evaluation does) and sampled at
  `--temperature` (as rollouts do), each generated once to the longest budget; for every budget in
  `--budgets`, the accuracy and the fraction cut there, read off the same answers (`at_budget`: a greedy
  answer, and a seeded sample, cut at B tokens is the answer generated with budget B); `--out` keeps
  every answer (JSON lines).
partners: each partner's greedy accuracy on add2-words' validation split (and, with `--test`, on its 500
  test problems), and how likely the scorer (SmolLM2) finds the partner's correct greedy answers: the
  scorer's log-prob of the answer's tokens (its own tokenizer and chat template, EOS left out) per UTF-8
  byte of the answer, as xhacpo's per-byte ratio reads a peer's text (clients/sequence_ratio.py). The
  scorer's own correct greedy answers are scored too, for reference.

Each prints one JSON line per measurement. A bad flag or an unknown model exits 2 with one line.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Sequence

WORDS_TASK = {"kind": "arithmetic", "digits": 2, "operators": "+", "num_eval": 500, "num_validation": 200,
              "style": "words"}


def _load(name: str) -> Any:
    """`load_model(name)`; an unknown or unusable model exits 2 with the message that names it."""
    from hacfed.models.loading import load_model

    try:
        return load_model(name, progress=False)
    except ValueError as exc:
        print(f"pretrained_testbeds.py: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def _greedy(loaded: Any, problems: Sequence[Any], budget: int) -> list[Any]:
    from hacfed.rollout.greedy_eval import greedy_generate

    return greedy_generate(loaded.model, loaded.tokenizer, [p.messages for p in problems], max_new_tokens=budget,
                           batch_size=32)


def at_budget(tokenizer: Any, completions: Sequence[Any], budget: int) -> tuple[list[str], list[bool]]:
    """Each completion as budget `budget` would have left it: its text (the first `budget` tokens), and
    whether it was cut there. `token_ids` leave EOS out, so an answer of `budget` tokens or more had no
    room for its EOS: it is cut."""
    texts = [tokenizer.decode(list(c.token_ids[:budget]), skip_special_tokens=True) for c in completions]
    return texts, [len(c.token_ids) >= budget for c in completions]


def per_byte_logps(scorer: Any, problems: Sequence[Any], texts: Sequence[str]) -> list[float]:
    """The scorer's log-prob of each text as its reply to the problem's prompt, per UTF-8 byte."""
    import torch

    from hacfed.rollout.logprobs import sequence_logprobs
    from hacfed.trajectory import render_prompt_ids

    tok = scorer.tokenizer
    out: list[float] = []
    for start in range(0, len(texts), 16):
        rows = range(start, min(start + 16, len(texts)))
        prompts = [render_prompt_ids(tok, problems[i].messages) for i in rows]
        responses = [list(tok(texts[i], add_special_tokens=False)["input_ids"]) for i in rows]
        with torch.inference_mode():
            logp, mask = sequence_logprobs(scorer.model, prompts, responses, tok.pad_token_id)
        for row, i in enumerate(rows):
            out.append(float((logp[row] * mask[row]).sum()) / len(texts[i].encode()))
    return out


def _summary(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"n": len(values), "mean": round(math.fsum(values) / len(values), 3),
            "median": round(ordered[len(ordered) // 2], 3)} if values else {"n": 0}


def partners(args: argparse.Namespace) -> None:
    from hacfed.tasks.registry import load_task

    task = load_task(WORDS_TASK)
    validation, test = list(task.validation_problems()), list(task.eval_problems())
    scorer = _load(args.scorer)
    budget = args.budget or task.max_new_tokens
    for name in [*args.partners.split(","), args.scorer]:
        loaded = scorer if name == args.scorer else _load(name)
        t0 = time.perf_counter()
        answers = _greedy(loaded, validation, budget)
        right = [(p, c.text) for p, c in zip(validation, answers) if task.verify(p, c.text).reward > 0]
        row: dict[str, Any] = {"model": name, "validation_accuracy": round(len(right) / len(validation), 3)}
        if args.test and name != args.scorer:
            rewards = [task.verify(p, c.text).reward for p, c in zip(test, _greedy(loaded, test, budget))]
            row["test_accuracy"] = round(sum(rewards) / len(rewards), 3)
        scored = per_byte_logps(scorer, [p for p, _ in right], [t for _, t in right])
        row.update(scorer=args.scorer, scorer_logp_per_byte=_summary(scored),
                   examples=[t for _, t in right[:3]], seconds=round(time.perf_counter() - t0, 1))
        print(json.dumps(row), flush=True)


def story(args: argparse.Namespace) -> None:
    from hacfed.rollout.hf import generate
    from hacfed.tasks.registry import load_task

    task = load_task({"kind": "story"})
    problems = list(task.validation_problems())[: args.problems]
    loaded = _load(args.model)
    budgets = sorted(args.budgets)
    for label, chosen in (("greedy", problems), ("sampled", problems[: args.samples])):
        t0 = time.perf_counter()
        if label == "greedy":
            answers = _greedy(loaded, chosen, budgets[-1])
        else:
            answers = [g[0] for g in generate(loaded.model, loaded.tokenizer, [p.messages for p in chosen],
                                              num_samples=1, max_new_tokens=budgets[-1],
                                              temperature=args.temperature, batch_size=16, seed=0)]
        seconds = time.perf_counter() - t0
        lengths = [len(c.token_ids) for c in answers]
        if args.out is not None:  # every answer at the longest budget, to read or score again later
            with args.out.open("a", encoding="utf-8") as out:
                for p, c in zip(chosen, answers):
                    out.write(json.dumps({"model": args.model, "pass": label, "prompt_id": p.prompt_id,
                                          "tokens": len(c.token_ids), "text": c.text}) + "\n")
        for budget in budgets:
            texts, cut = at_budget(loaded.tokenizer, answers, budget)
            rewards = [task.verify(p, t).reward for p, t in zip(chosen, texts)]
            print(json.dumps({
                "model": args.model, "pass": label, "temperature": None if label == "greedy" else args.temperature,
                "budget": budget, "problems": len(chosen), "accuracy": round(sum(rewards) / len(rewards), 3),
                "truncated_frac": round(sum(cut) / len(cut), 3), "mean_tokens": round(sum(lengths) / len(lengths), 1),
                "generate_s": round(seconds, 1), "examples": texts[:2],
            }), flush=True)


def accuracy(args: argparse.Namespace) -> None:
    from hacfed.tasks.registry import load_task
    from hacfed.tools.sim import TASKS, response_budget

    spec, budget = TASKS[args.task]
    task = load_task(spec)
    budget = args.budget or response_budget(budget, task)
    problems = list(task.validation_problems())[: args.problems]
    for name in args.models.split(","):
        loaded = _load(name)
        t0 = time.perf_counter()
        answers = _greedy(loaded, problems, budget)
        rewards = [task.verify(p, c.text).reward for p, c in zip(problems, answers)]
        print(json.dumps({"model": name, "task": args.task, "split": "validation", "problems": len(problems),
                          "budget": budget, "accuracy": round(sum(rewards) / len(rewards), 3),
                          "truncated_frac": round(sum(len(c.token_ids) >= budget for c in answers) / len(answers), 3),
                          "examples": [c.text for c in answers[:3]], "seconds": round(time.perf_counter() - t0, 1)}),
              flush=True)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an int >= 1, got {text!r}")
    return value


def _budgets(text: str) -> list[int]:
    try:
        return [_positive_int(part) for part in text.split(",")]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"must be ints >= 1 separated by commas, got {text!r}") from None


def _temperature(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from hacfed.tools.sim import TASKS

    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    a = sub.add_parser("accuracy", allow_abbrev=False)
    a.add_argument("--models", default="smollm2,smollm2-drilled")
    a.add_argument("--task", default="add2-story", choices=sorted(TASKS))
    a.add_argument("--problems", type=_positive_int, default=200)
    a.add_argument("--budget", type=_positive_int, default=None, help="default: the task's own, as hacfed sim")
    s = sub.add_parser("story", allow_abbrev=False)
    s.add_argument("--model", default="smollm2")
    s.add_argument("--problems", type=_positive_int, default=200)
    s.add_argument("--samples", type=_positive_int, default=64, help="sampled answers (the first validation problems)")
    s.add_argument("--temperature", type=_temperature, default=0.7)
    s.add_argument("--budgets", type=_budgets, default=[64, 96, 128, 160])
    s.add_argument("--out", type=Path, default=None, help="append every answer here (JSON lines)")
    p = sub.add_parser("partners", allow_abbrev=False)
    p.add_argument("--partners", default="tiny-qwen2-worked,tiny-llama-words")
    p.add_argument("--scorer", default="smollm2")
    p.add_argument("--budget", type=_positive_int, default=None, help="greedy budget (default: add2-words' own)")
    p.add_argument("--test", action="store_true", help="also each partner's accuracy on the 500 test problems")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    {"partners": partners, "story": story, "accuracy": accuracy}[args.command](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
