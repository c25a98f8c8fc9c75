"""An upper bound for the complementary-skills setting: can a specialist learn the other half at all?

    OMP_NUM_THREADS=1 .venv/bin/python bench/skill_transfer.py --model chain-llama-add --learn sub \\
        --lr 5e-5 --steps 320 [--data other|mix] [--out FILE.json]

Sharing rollouts can teach a learner at most what supervised imitation of *perfect* solutions
teaches it with the same optimizer budget: a peer's verified successes are such solutions, fewer of
them and weighted down. This bench measures that bound directly. It fine-tunes a built zoo model
with plain cross-entropy on the chain task's gold worked solutions, at an RL learning rate, and
reports greedy accuracy on the *validation* split (never the test split), both on the half the
model was not warmed up on (`--learn`) and on the whole mix, at a few step counts.

  --data other   train on the other half only: a peer that only ever shows the new skill
  --data mix     train on the full add/sub mix: imitation that also rehearses the old skill

`--learn word` (or `sym`) asks the same of the notations setting: a model warmed up on prompts
written one way (`47+28+15=`, or `What is 47 plus 28 plus 15?`) learning to read the other
(docs/results.md, skills-notation): chain-llama learns to read words from gold solutions (0.005 ->
0.365 greedy in 160 steps at lr 2e-4, `--data other`), where a new operation stays <= 0.06 after 320
steps at 1e-3; at lr 5e-5 neither moves within 160 steps.

A run of `hacfed sim` with 20 rounds takes 80 optimizer steps per agent (4 minibatches a round),
each on 64 samples of which at most a few are a peer's successes on the other half; `--steps 320`
at `--batch 16` is therefore far more imitation of the new skill than sharing can give in such a run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

from hacfed.models.loading import load_model
from hacfed.models.warmup import collate, default_evaluator, encode_example
from hacfed.tasks.chain import NOTATIONS, OPERATIONS, ChainTask

CHECKPOINTS = (0, 20, 40, 80, 160, 320, 640)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="chain-llama-add", help="a built zoo preset (default: %(default)s)")
    parser.add_argument("--learn", default="sub", choices=OPERATIONS + NOTATIONS,
                        help="the half to learn: an operation, or a notation of the prompts (default: %(default)s)")
    parser.add_argument(
        "--data", default="other", choices=("other", "mix"), help="training data (default: %(default)s)"
    )
    parser.add_argument("--lr", type=float, default=5e-5, help="AdamW learning rate (default: %(default)s)")
    parser.add_argument("--batch", type=int, default=16, help="examples per step (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=320, help="optimizer steps (default: %(default)s)")
    parser.add_argument(
        "--problems", type=int, default=200, help="validation problems per score (default: %(default)s)"
    )
    parser.add_argument("--seed", type=int, default=0, help="data order seed (default: %(default)s)")
    parser.add_argument("--out", type=Path, help="write the scores as JSON here")
    args = parser.parse_args(argv)
    for name in ("lr", "batch", "steps", "problems"):
        value = getattr(args, name)
        if not (value > 0 and math.isfinite(value)):
            parser.error(f"--{name} must be a finite number > 0, got {value!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    try:
        loaded = load_model(args.model, progress=False)
    except ValueError as exc:  # an unknown or unusable --model: the message names it
        print(f"skill_transfer.py: error: {exc}", file=sys.stderr)
        return 2
    model, tokenizer = loaded.model, loaded.tokenizer
    if args.learn in NOTATIONS:  # the notations setting: both operations, prompts written two ways
        new_half, whole = ChainTask(notations=(args.learn,)), ChainTask(notations=NOTATIONS)
    else:
        new_half, whole = ChainTask(operations=(args.learn,)), ChainTask()
    source = new_half if args.data == "other" else whole
    train = [encode_example(tokenizer, p) for p in source.train_problems()]
    scored = {args.learn: (new_half, new_half.validation_problems()[: args.problems]),
              "mix": (whole, whole.validation_problems()[: args.problems])}
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(args.seed)
    rows: list[dict] = []
    start = time.monotonic()

    def score(step: int) -> None:
        model.eval()
        row = {"step": step, **{name: default_evaluator(model, tokenizer, task, problems, 48)
                                for name, (task, problems) in scored.items()}}
        rows.append(row)
        print(f"step {step:4d}: greedy {args.learn} {row[args.learn]:.3f}, mix {row['mix']:.3f} "
              f"({time.monotonic() - start:.0f} s)", flush=True)

    score(0)
    for step in range(1, args.steps + 1):
        picks = torch.randint(len(train), (args.batch,), generator=generator).tolist()
        batch = collate([train[i] for i in picks], pad_id)
        model.train()
        loss = model(**batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step in CHECKPOINTS or step == args.steps:
            score(step)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        args.out.write_text(json.dumps({"settings": settings, "split": "validation", "scores": rows,
                                        "load_avg": os.getloadavg()[0]}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
