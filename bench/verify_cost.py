"""What a hostile GSM8K submission costs the coordinator's verifier, against an honest one, in one run.

    OMP_NUM_THREADS=1 .venv/bin/python bench/verify_cost.py [--repeats 3] [--out FILE.json]

Each pass judges three 16-sample submissions for one prompt of the built-in GSM8K task (G = 16,
`verify_threads` 2, two math-verify workers started before the clock), each on a fresh coordinator:

  honest  half the samples `\\boxed{gold}`, half a wrong number, a quarter as `\\frac{2 gold}{2}`
          (decided by math-verify, not the numeric fast path; its claims are computed with the
          same task before the clock, so those come from the verdict cache)
  tower   16 x `\\boxed{9^{9^{9^{9}}}}` (security.md N3): scores 0 in process, by the size screen
  budget  16 distinct towers `\\boxed{9^{9^{9}}+i}` on a verifier whose size screen is opened wide,
          so each runs into the sandbox's timeout: refused whole by `verify_budget_s`

and prints the wall seconds of `Coordinator.submit` for each, their medians over `--repeats` passes
and the ratios to the honest submission of the same passes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hacfed.messages import Submission
from hacfed.server.coordinator import Coordinator, CoordinatorConfig, Journal
from hacfed.tasks.math_verifier import MathVerifierConfig
from hacfed.tasks.registry import load_task
from hacfed.tasks.sandbox import SandboxLimits
from hacfed.trajectory import Trajectory

G = 16
TOWER = "\\boxed{9^{9^{9^{9}}}}"
WIDE = dict(max_exponent=10**12, max_value_digits=10**12)  # the size screen opened wide


def _config(state: Path, budget_s: float) -> CoordinatorConfig:
    return CoordinatorConfig.from_mapping(dict(
        run_id="verify-cost", task={"kind": "gsm8k"}, rounds=1, prompts_per_round=1, group_size=G,
        expected_participants=1, min_participants=1, round_deadline_s=600.0, state_dir=str(state),
        verify_threads=2, verify_budget_s=budget_s, sampling={"max_new_tokens": 256},
    ))


def _judge(task: Any, texts: list[str], honest: bool, budget_s: float) -> tuple[float, str]:
    """Wall seconds of one submission of `texts` and its outcome; an honest lab claims its verifier's
    verdicts (computed before the clock), a hostile one claims 0."""
    with tempfile.TemporaryDirectory() as tmp:
        coord = Coordinator(_config(Path(tmp), budget_s), task, Journal(Path(tmp) / "journal.sqlite"))
        coord.register("lab-a")
        plan = coord.open_round(0)
        prompt = plan.prompts[0]
        problem = task.problem(prompt.prompt_id)
        claims = [task.verify(problem, t).reward for t in texts] if honest else [0.0] * len(texts)
        samples = tuple(Trajectory(
            trajectory_id=f"lab-a/0/{i}", prompt_id=prompt.prompt_id, source_id="lab-a", policy_version=0,
            prompt=prompt.messages, response_text=text, reward=claim, source_logp_sum=-1.0, source_token_count=8,
            finish_reason="stop") for i, (text, claim) in enumerate(zip(texts, claims)))
        started = time.perf_counter()
        result = coord.submit(Submission(plan.run_id, "lab-a", 0, samples))
        took = time.perf_counter() - started
        coord.journal.close()
    codes = sorted({r.code.value for r in result.rejected})
    return took, f"accepted {len(result.accepted_ids)}, refused {codes or 'none'}"


def _honest(task: Any) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        coord = Coordinator(_config(Path(tmp), 20.0), task, Journal(Path(tmp) / "journal.sqlite"))
        gold = task.problem(coord.open_round(0).prompts[0].prompt_id).answer
        coord.journal.close()
    n = int(gold)
    texts = [f"So the answer is \\boxed{{{gold}}}." if i % 2 == 0 else f"So it is \\boxed{{{n + i}}}."
             for i in range(G)]
    texts[1::4] = [f"It is \\boxed{{\\frac{{{2 * n}}}{{2}}}}."] * len(texts[1::4])
    return texts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=20.0, help="verify_budget_s of every pass (default 20)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    task = load_task({"kind": "gsm8k"})
    wide = dataclasses.replace(task, verifier=MathVerifierConfig(
        answer_mode="boxed_or_last_number", sandbox=SandboxLimits(timeout_s=5.0), **WIDE))
    honest = _honest(task)
    budget_texts = [f"\\boxed{{9^{{9^{{9}}}}+{i}}}" for i in range(G)]
    for t in (task, wide):  # both workers of each verifier started before the clock
        problem = t.train_problems()[0]
        t.start_verify_batch([(problem, "\\boxed{\\frac{4}{2}}"), (problem, "\\boxed{\\frac{6}{2}}")])()
    runs: dict[str, list[float]] = {"honest": [], "tower": [], "budget": []}
    outcomes: dict[str, str] = {}
    try:
        for _ in range(args.repeats):
            for name, (t, texts) in {"honest": (task, honest), "tower": (task, [TOWER] * G),
                                     "budget": (wide, budget_texts)}.items():
                took, outcomes[name] = _judge(t, texts, name == "honest", args.budget_s)
                runs[name].append(took)
                print(f"{name:7} {took:7.3f} s  {outcomes[name]}", flush=True)
    finally:
        task.close()
        wide.close()
    medians = {name: statistics.median(times) for name, times in runs.items()}
    ratios = {name: [r / h for r, h in zip(runs[name], runs["honest"])] for name in runs}
    for name in runs:
        print(f"median {name:7} {medians[name]:7.3f} s  x{statistics.median(ratios[name]):7.1f} the honest "
              f"submission  ({outcomes[name]})")
    if args.out:
        args.out.write_text(json.dumps({"seconds": runs, "median_s": medians, "outcomes": outcomes,
                                        "budget_s": args.budget_s}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
