"""What the checks on a success's text cost honest answers: the folded deny-list, and the chain step check.

    python bench/text_checks.py deny-cost
    OMP_NUM_THREADS=1 python bench/text_checks.py deny-cost --model smollm2 --problems 48 --answer-tasks add2-words
    OMP_NUM_THREADS=1 python bench/text_checks.py chain-steps --models chain-llama,chain-qwen2 --problems 1000

deny-cost: runs a lab's deny-list (`hacfed.clients.textfilter`, the default patterns, and with the
canary `see-evil.example` named too) over the reference solution of every problem of every built-in
task (add2, add2-words, chain with both notations, the shipped GSM8K, the example plugin when it is
installed), as the literal match read them and as the folded one does (`hacfed.textfold`), and
prints one JSON line per task: how many solutions each refuses, with up to three refused. With
`--model`, the model's answers instead (one sampled at temperature 1 and one greedy per problem) to
the first `--problems` validation problems of add2-words and to the first test problems of GSM8K.

chain-steps: answers the first `--problems` validation problems of the chain testbed (3 terms, add
and sub) with each model, greedily and once sampled at temperature 1, and prints one JSON line per
(model, pass): how many answers the final answer alone scores 1 (`verify_final_answer`), how many
the task's verifier scores 1 with the step check (`ChainTask.verify`), how many of the former the
step check sets to 0 and why, and how many successes the response format refuses; then, with
`--group-size` samples for each of the first `--group-problems` problems (a round's groups), how
many samples the step check sets to 0 and how many groups hold one (what a format check instead
would leave out whole at every peer).
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path
from typing import Any

CANARY = "see-evil.example"
# The deny-list as it was matched before folding: the raw text, the URL pattern with word boundaries.
LITERAL_URL = r"(?i)\b(?:https?|ftp|file)://|\bwww\.[a-z0-9-]+\."


def _tasks() -> dict[str, Any]:
    from hacfed.tasks.arithmetic import ArithmeticTask
    from hacfed.tasks.chain import ChainTask
    from hacfed.tasks.math_data import gsm8k_task
    from hacfed.tasks.registry import load_task

    tasks = {
        "add2": ArithmeticTask(digits=2, num_validation=200),
        "add2-words": ArithmeticTask(digits=2, num_validation=200, style="words"),
        "chain": ChainTask(terms=3, notations=("sym", "word")),
        "gsm8k": gsm8k_task(),
    }
    example = Path(__file__).resolve().parent.parent / "examples" / "hacfed-task-example"
    try:
        tasks["plugin:reverse-word"] = load_task(
            {"kind": "plugin", "plugin": "reverse-word", "train_files": ["data/train.jsonl"],
             "eval_files": ["data/eval.jsonl"], "question_field": "question", "answer_field": "answer"},
            base_dir=example)
    except (ValueError, ImportError) as exc:  # the example plugin is not installed: said, not fatal
        print(json.dumps({"task": "plugin:reverse-word", "skipped": str(exc)}))
    return tasks


def _literal_refuses(text: str, deny_strings: tuple[str, ...]) -> bool:
    from hacfed.clients.textfilter import EMAIL_PATTERN

    return any(re.search(p, text) for p in (LITERAL_URL, EMAIL_PATTERN)) or any(s in text for s in deny_strings)


def _count(texts: list[tuple[str, str]]) -> dict[str, Any]:
    """Refusals of (prompt id, text) by the literal and the folded deny-list, without and with CANARY."""
    from hacfed.clients.textfilter import outbound
    from hacfed.trajectory import ChatMessage, Trajectory

    out: dict[str, Any] = {"texts": len(texts)}
    for label, strings in (("defaults", ()), ("defaults+canary", (CANARY,))):
        flt = outbound(deny_strings=strings)
        refused = [(pid, text) for pid, text in texts if flt.why_not(
            Trajectory("t", pid, "s", 0, (ChatMessage("user", "q"),), text, 1.0, -1.0, 1, "stop")) is not None]
        out[f"literal_{label}"] = sum(_literal_refuses(text, strings) for _pid, text in texts)
        out[f"folded_{label}"] = len(refused)
        out[f"folded_{label}_examples"] = [{"prompt_id": pid, "text": text[:300]} for pid, text in refused[:3]]
    return out


def deny_cost(args: argparse.Namespace) -> None:
    if args.model:  # the model's answers only: the solutions' counts do not depend on it
        _model_answers(args)
        return
    for name, task in _tasks().items():
        validation = getattr(task, "validation_problems", tuple)()  # a plugin task has no validation split
        problems = [*task.train_problems(), *validation, *task.eval_problems()]
        print(json.dumps({"task": name, "what": "reference solutions",
                          **_count([(p.prompt_id, p.solution) for p in problems])}), flush=True)


def _model_answers(args: argparse.Namespace) -> None:
    from hacfed.models.loading import load_model
    from hacfed.rollout.hf import generate

    tasks = _tasks()
    loaded = load_model(args.model, progress=False)
    for name, split, budget in (("add2-words", "validation", 48), ("gsm8k", "eval", 256)):
        if name not in args.answer_tasks.split(","):
            continue
        task = tasks[name]
        problems = list(task.validation_problems() if split == "validation" else task.eval_problems())
        problems = problems[: args.problems]
        texts: list[tuple[str, str]] = []
        t0 = time.perf_counter()
        for greedy in (True, False):
            groups = generate(loaded.model, loaded.tokenizer, [p.messages for p in problems], num_samples=1,
                              max_new_tokens=budget, greedy=greedy, batch_size=args.batch_size, seed=0)
            texts += [(p.prompt_id, g[0].text) for p, g in zip(problems, groups)]
        print(json.dumps({"task": name, "what": f"{args.model} answers (greedy and sampled, {split})",
                          "max_new_tokens": budget, "generate_s": round(time.perf_counter() - t0, 1),
                          **_count(texts)}), flush=True)


def chain_steps(args: argparse.Namespace) -> None:
    from hacfed.models.loading import load_model
    from hacfed.response_format import response_format
    from hacfed.rollout.hf import generate
    from hacfed.tasks.chain import ChainTask, verify_final_answer

    task = ChainTask(terms=3)
    fmt = response_format(task)
    problems = list(task.validation_problems())[: args.problems]
    for model in args.models.split(","):
        loaded = load_model(model, progress=False)
        for greedy in (True, False):
            t0 = time.perf_counter()
            groups = generate(loaded.model, loaded.tokenizer, [p.messages for p in problems], num_samples=1,
                              max_new_tokens=64, greedy=greedy, batch_size=args.batch_size, seed=0)
            texts = [g[0].text for g in groups]
            final = [verify_final_answer(p.answer, t).reward for p, t in zip(problems, texts)]
            verdicts = [task.verify(p, t) for p, t in zip(problems, texts)]
            changed = [(t, v.reason) for t, f, v in zip(texts, final, verdicts) if f > 0 and v.reward == 0]
            reasons: dict[str, int] = {}
            for _t, reason in changed:
                key = reason.split(" '", 1)[0]
                reasons[key] = reasons.get(key, 0) + 1
            print(json.dumps({
                "model": model, "greedy": greedy, "problems": len(problems),
                "final_answer_right": int(sum(final)), "verified_with_steps": int(sum(v.reward for v in verdicts)),
                "right_answer_false_step": len(changed),
                "rate_of_right_answers": round(len(changed) / max(sum(final), 1), 4), "why": reasons,
                "successes_outside_format": sum(v.reward > 0 and not fmt.fits(t, v.reward)
                                                for t, v in zip(texts, verdicts)),
                "examples": [t for t, _ in changed[:3]], "generate_s": round(time.perf_counter() - t0, 1),
            }), flush=True)
        _groups(args, task, loaded, model)


def _groups(args: argparse.Namespace, task: Any, loaded: Any, model: str) -> None:
    """G samples per problem, as a round samples them: the samples the step check sets to 0, and the
    groups that hold such a sample (what a format check would leave out whole at every peer)."""
    from hacfed.rollout.hf import generate
    from hacfed.tasks.chain import verify_final_answer

    problems = list(task.validation_problems())[: args.group_problems]
    groups = generate(loaded.model, loaded.tokenizer, [p.messages for p in problems], num_samples=args.group_size,
                      max_new_tokens=64, batch_size=args.batch_size, seed=1)
    flips = [[verify_final_answer(p.answer, c.text).reward > task.verify(p, c.text).reward for c in group]
             for p, group in zip(problems, groups)]
    with_success = sum(any(verify_final_answer(p.answer, c.text).reward > 0 for c in group)
                       for p, group in zip(problems, groups))
    print(json.dumps({
        "model": model, "group_size": args.group_size, "groups": len(problems),
        "samples_set_to_0": sum(map(sum, flips)), "samples": len(problems) * args.group_size,
        "groups_with_a_success": with_success, "groups_with_a_false_step_success": sum(map(any, flips)),
    }), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    deny = sub.add_parser("deny-cost", help="the folded deny-list over every built-in task's solutions")
    deny.add_argument("--model", default=None, help="a model's answers instead (e.g. smollm2)")
    deny.add_argument("--problems", type=int, default=96)
    deny.add_argument("--answer-tasks", default="add2-words,gsm8k", help="whose problems the model answers")
    deny.add_argument("--batch-size", type=int, default=24)
    steps = sub.add_parser("chain-steps", help="the chain step check over models' answers")
    steps.add_argument("--models", default="chain-llama,chain-qwen2")
    steps.add_argument("--problems", type=int, default=500)
    steps.add_argument("--batch-size", type=int, default=50)
    steps.add_argument("--group-problems", type=int, default=200)
    steps.add_argument("--group-size", type=int, default=8)
    args = parser.parse_args()
    deny_cost(args) if args.command == "deny-cost" else chain_steps(args)


if __name__ == "__main__":
    main()
