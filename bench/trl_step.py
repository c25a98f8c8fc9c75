"""hacfed's local step against TRL's GRPOTrainer with the GSPO recipe, side by side in one run.

    OMP_NUM_THREADS=1 .venv/bin/python bench/trl_step.py            # needs: pip install -e '.[bench]'
    OMP_NUM_THREADS=1 .venv/bin/python bench/trl_step.py --rounds 5 --json runs/trl-step.json
    OMP_NUM_THREADS=1 .venv/bin/python bench/trl_step.py --task chain --model chain-llama --max-new-tokens 40
    hacfed models export smollm2 runs/smollm2-hf     # a plain HF directory TRL accepts (GGUF: "purely quantized")
    OMP_NUM_THREADS=1 .venv/bin/python bench/trl_step.py --model runs/smollm2-hf --task add2-words --finetune lora \
        --prompts 4 --group-size 4 --max-new-tokens 48 --rounds 5 --json runs/trl-step-smollm2.json

One round of each side = one rollout of P prompts x G completions and U optimizer updates on them:

  * hacfed: what a participant does with mode "gspo" (`Participant.rollout` -> `rollout_plan` ->
    `hacfed.rollout.hf.generate`, then `Participant.train_on_pool` -> `hacpo_update`: one
    teacher-forced forward for the old log-probs, then U minibatches of P*G/U sequences);
  * TRL: `GRPOTrainer` with importance_sampling_level="sequence", loss_type="grpo" (mean over each
    sequence, then over sequences: hacfed's GSPO objective), the same clip window (epsilon 3e-4,
    epsilon_high 4e-4), beta 0 (no reference model; hacfed's kl_coef set to 0 too), the same G,
    P*G completions per generation, steps_per_generation U, the same max tokens, temperature 1,
    top_p 1, no top-k, constant learning rate, AdamW, clip-grad-norm, transformers generate (no vLLM),
    no activation checkpointing (TRL's default turns it on; hacfed's memory plan leaves it off below
    300M parameters, and the run refuses a model where it would not), the same full fine-tune or
    LoRA adapter (hacfed's rank, alpha and all-linear targets, no dropout), the same weights dtype.

Both start from the same weights (two copies of the same preset) on the same prompts, one thread.
The two alternate inside one process: a TRL callback runs one hacfed round after every U TRL
steps, and that time is subtracted from TRL's, so drifting CPU speed hits both sides alike. The
first `--warmup` rounds of each side are not counted. It prints completions per second of each
side (median over rounds) and the ratio hacfed / TRL, per round and overall, and the same per
completion token (each round's completions x its mean length, EOS excluded; `trl_step_report.per_token`),
by wall and by CPU time: both sides sample at temperature 1 with the same budget (checked with the
rest), but from different random streams, so their answers' lengths differ and completions alone
would count the side that sampled longer as slower.

Differences that remain and are TRL's own work: TRL also computes per-token entropies in its loss
forward and gathers/logs metrics every step; those are part of what a TRL user pays per step.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trl_step_report import format_summary, per_token, summarize  # noqa: E402  (the pure summary, beside this file)

TASKS = ("add2", "add2-words", "chain")
FINETUNES = ("full", "lora")


def make_task(name: str) -> Any:
    if name == "chain":
        from hacfed.tasks.chain import ChainTask

        return ChainTask()
    from hacfed.tasks.arithmetic import ArithmeticTask

    if name == "add2-words":  # `hacfed sim --task add2-words`: the sums in a sentence, for chat models
        return ArithmeticTask(style="words", num_eval=500, num_validation=200)
    return ArithmeticTask()


@dataclass(frozen=True)
class BenchSettings:
    """What both sides share; every field reaches both (see `mismatches`)."""

    model: str = "tiny-llama"
    task: str = "add2"  # add2: 2-digit addition (2-4 token answers); chain: worked 3-term chains (20-40)
    finetune: str = "full"  # or "lora": an adapter on both sides (hacfed's rank and alpha)
    prompts: int = 16
    group_size: int = 8
    updates: int = 2
    max_new_tokens: int = 16
    learning_rate: float = 5e-5
    max_grad_norm: float = 1.0
    clip_low: float = 3e-4
    clip_high: float = 4e-4
    rounds: int = 5
    warmup: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("prompts", "group_size", "updates", "max_new_tokens", "rounds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {sorted(TASKS)}, got {self.task!r}")
        if self.finetune not in FINETUNES:
            raise ValueError(f"finetune must be one of {list(FINETUNES)}, got {self.finetune!r}")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise ValueError(f"warmup must be an int >= 0, got {self.warmup!r}")
        if (self.prompts * self.group_size) % self.updates:
            raise ValueError(
                f"prompts x group_size ({self.prompts * self.group_size}) must split into {self.updates} equal updates"
            )

    @property
    def completions_per_round(self) -> int:
        return self.prompts * self.group_size

    @property
    def minibatch(self) -> int:
        return self.completions_per_round // self.updates

    @property
    def total_rounds(self) -> int:
        return self.warmup + self.rounds


def hacfed_hacpo(s: BenchSettings) -> Any:
    """hacfed's GSPO: own samples only, the paper's clip window, no KL (TRL's beta=0)."""
    from hacfed.hacpo_config import HacpoConfig

    return HacpoConfig(mode="gspo", self_clip_low=s.clip_low, self_clip_high=s.clip_high, kl_coef=0.0)


def hacfed_sampling(s: BenchSettings) -> Any:
    """hacfed's rollout sampling: temperature 1, top-p 1, TRL's budget (`trl_config_kwargs`)."""
    from hacfed.messages import SamplingParams

    return SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=s.max_new_tokens)


def hacfed_participant_kwargs(s: BenchSettings) -> dict[str, Any]:
    return dict(
        participant_id="bench", model=s.model, finetune=s.finetune, learning_rate=s.learning_rate,
        minibatch_size=s.minibatch,
        max_grad_norm=s.max_grad_norm, max_response_len=s.max_new_tokens + 1,
        rollout_batch_size=s.completions_per_round, seed=s.seed,
    )


def trl_config_kwargs(s: BenchSettings, output_dir: str) -> dict[str, Any]:
    """GRPOConfig arguments of the GSPO recipe matching `s` (no vLLM, CPU, one process)."""
    return dict(
        output_dir=output_dir,
        use_cpu=True, bf16=False, fp16=False, use_vllm=False,
        per_device_train_batch_size=s.minibatch, gradient_accumulation_steps=1,
        steps_per_generation=s.updates, num_generations=s.group_size, num_iterations=1,
        max_completion_length=s.max_new_tokens, temperature=1.0, top_p=1.0, top_k=0,
        importance_sampling_level="sequence", loss_type="grpo", scale_rewards="group",
        epsilon=s.clip_low, epsilon_high=s.clip_high, beta=0.0,
        learning_rate=s.learning_rate, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        max_grad_norm=s.max_grad_norm, optim="adamw_torch",
        max_steps=s.total_rounds * s.updates, shuffle_dataset=False, disable_dropout=True,
        logging_steps=10_000, save_strategy="no", report_to=[], disable_tqdm=True,
        dataloader_num_workers=0, seed=s.seed, gradient_checkpointing=False,
    )


def trl_peft_config(s: BenchSettings, participant: Any) -> Any:
    """TRL's LoRA adapter for `s.finetune == "lora"`: hacfed's own (`hacfed.clients.training`); else None."""
    if s.finetune != "lora":
        return None
    from peft import LoraConfig

    return LoraConfig(r=participant.lora_rank, lora_alpha=participant.lora_alpha, lora_dropout=0.0,
                      target_modules="all-linear")


def mismatches(s: BenchSettings, hacpo: Any, participant: Any, trl_args: Any, sampling: Any) -> list[str]:
    """Every shared setting on which the two configured sides disagree ([] when they match).

    Works on any objects with the attributes (a real HacpoConfig/ParticipantConfig/GRPOConfig/
    SamplingParams or stand-ins), so it is testable without trl. Generation batch of TRL =
    minibatch x steps."""
    checks = [
        ("mode", hacpo.mode, "gspo"),
        ("sequence-level ratio", trl_args.importance_sampling_level, "sequence"),
        ("sequence-mean loss", trl_args.loss_type, "grpo"),
        ("clip low (hacfed)", hacpo.self_clip_low, s.clip_low),
        ("clip low (TRL)", trl_args.epsilon, s.clip_low),
        ("clip high (hacfed)", hacpo.self_clip_high, s.clip_high),
        ("clip high (TRL)", trl_args.epsilon_high, s.clip_high),
        ("KL (hacfed kl_coef)", hacpo.kl_coef, 0.0),
        ("KL (TRL beta)", trl_args.beta, 0.0),
        ("G (TRL)", trl_args.num_generations, s.group_size),
        ("minibatch (hacfed)", participant.minibatch_size, s.minibatch),
        ("minibatch (TRL)", trl_args.per_device_train_batch_size * trl_args.gradient_accumulation_steps, s.minibatch),
        ("updates per round (TRL)", trl_args.steps_per_generation, s.updates),
        ("completions per generation (TRL)",
         trl_args.per_device_train_batch_size * trl_args.steps_per_generation, s.completions_per_round),
        ("passes over a rollout (TRL)", trl_args.num_iterations, 1),
        ("max tokens (TRL)", trl_args.max_completion_length, s.max_new_tokens),
        ("max tokens (hacfed)", sampling.max_new_tokens, s.max_new_tokens),
        ("max tokens fit (hacfed)", participant.max_response_len >= s.max_new_tokens + 1, True),
        ("learning rate (hacfed)", participant.learning_rate, s.learning_rate),
        ("learning rate (TRL)", trl_args.learning_rate, s.learning_rate),
        ("constant lr (TRL)", str(getattr(trl_args.lr_scheduler_type, "value", trl_args.lr_scheduler_type)),
         "constant"),
        ("grad clip (hacfed)", participant.max_grad_norm, s.max_grad_norm),
        ("grad clip (TRL)", trl_args.max_grad_norm, s.max_grad_norm),
        ("temperature (TRL)", trl_args.temperature, 1.0),
        ("temperature (hacfed)", sampling.temperature, 1.0),
        ("top_p (TRL)", trl_args.top_p, 1.0),
        ("top_p (hacfed)", sampling.top_p, 1.0),
        ("top_k off (TRL)", trl_args.top_k in (0, None), True),
        ("no vLLM (TRL)", trl_args.use_vllm, False),
        ("finetune (hacfed)", participant.finetune, s.finetune),
        ("activation checkpointing (TRL)", trl_args.gradient_checkpointing, False),
    ]
    return [f"{name}: {got!r}, want {want!r}" for name, got, want in checks if got != want]


def round_problems(s: BenchSettings, task: Any) -> list[list[Any]]:
    """P distinct training problems per round, seeded; both sides see the same list in order."""
    problems = list(task.train_problems())
    rng = random.Random(s.seed)
    chosen = rng.sample(problems, s.prompts * s.total_rounds)
    return [chosen[r * s.prompts:(r + 1) * s.prompts] for r in range(s.total_rounds)]


class HacfedSide:
    """A participant in mode gspo, driven round by round as a lab's step drives it."""

    def __init__(self, s: BenchSettings, task: Any) -> None:
        from hacfed.clients.participant import Participant, ParticipantConfig

        self.s, self.task = s, task
        self.hacpo = hacfed_hacpo(s)
        self.cfg = ParticipantConfig(**hacfed_participant_kwargs(s))
        self.sampling = hacfed_sampling(s)
        self.participant = Participant.from_spec(self.cfg, task)
        self.rewards: list[float] = []
        self.tokens: list[float] = []  # mean completion length (tokens, EOS excluded) per round

    def round(self, round_id: int, problems: Sequence[Any]) -> tuple[float, float]:
        """One rollout + update; returns (wall seconds, process CPU seconds)."""
        from hacfed.messages import PlannedPrompt, RoundPlan, RoundUpdate

        plan = RoundPlan(
            run_id="trl-bench", round_id=round_id,
            prompts=tuple(PlannedPrompt(p.prompt_id, p.messages) for p in problems),
            group_size=self.s.group_size, sampling=self.sampling, hacpo=self.hacpo,
        )
        t0, c0 = time.perf_counter(), time.process_time()
        trajectories = self.participant.rollout(plan)
        # The pool comes back from the coordinator as text; own ids are restored from the local cache.
        update = RoundUpdate(
            run_id="trl-bench", pool_round=round_id, pool=tuple(t.without_local_ids() for t in trajectories),
            capabilities={}, next_plan=None, participants=("bench",), hacpo=self.hacpo,
        )
        metrics = self.participant.train_on_pool(update)
        elapsed = (time.perf_counter() - t0, time.process_time() - c0)
        if metrics.get("num_updates") != self.s.updates:
            raise RuntimeError(f"hacfed ran {metrics.get('num_updates')} updates, expected {self.s.updates}")
        self.rewards.append(sum(t.reward for t in trajectories) / len(trajectories))
        self.tokens.append(sum(t.source_token_count for t in trajectories) / len(trajectories))
        return elapsed


def _trl_or_exit() -> Any:
    try:
        import trl
    except ImportError:
        print("bench/trl_step.py needs TRL, a bench-only dependency: pip install -e '.[bench]' "
              "(in the activated .venv)", file=sys.stderr)
        raise SystemExit(2)
    return trl


def run(s: BenchSettings, out_dir: str) -> dict[str, Any]:
    import torch

    trl = _trl_or_exit()
    from datasets import Dataset
    from transformers import TrainerCallback

    from hacfed.models.loading import load_model
    from hacfed.trajectory import messages_as_dicts

    torch.set_num_threads(1)
    # transformers' deprecation notices about TRL's gradient-checkpointing calls, once per step
    warnings.filterwarnings("ignore", category=FutureWarning)
    task = make_task(s.task)
    rounds = round_problems(s, task)
    hacfed = HacfedSide(s, task)
    loaded = load_model(s.model, progress=False)  # a second copy of the same weights for TRL
    by_id = {p.prompt_id: p for r in rounds for p in r}

    trl_tokens: list[float] = []  # TRL's mean completion length per generation (EOS excluded)

    def reward(prompts: Any, completions: Any, prompt_id: Sequence[str], completion_ids: Any = None,
               **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        if completion_ids is not None:
            eos = loaded.tokenizer.eos_token_id
            trl_tokens.append(sum(len([i for i in ids if i != eos]) for ids in completion_ids) / len(completion_ids))
        return [float(task.verify(by_id[pid], text).reward) for pid, text in zip(prompt_id, texts)]

    dataset = Dataset.from_list(
        [{"prompt": messages_as_dicts(p.messages), "prompt_id": p.prompt_id} for r in rounds for p in r]
    )
    args = trl.GRPOConfig(**trl_config_kwargs(s, out_dir))
    problems = (mismatches(s, hacfed.hacpo, hacfed.cfg, args, hacfed.sampling)
                + _loaded_mismatches(hacfed.participant, loaded.model))
    if problems:
        raise RuntimeError("the two sides are not configured alike: " + "; ".join(problems))

    hacfed_times: list[tuple[float, float]] = []  # (wall, CPU) seconds per round
    trl_times: list[tuple[float, float]] = []

    class Alternate(TrainerCallback):
        """After every U TRL steps (one TRL round), time it, then run one hacfed round."""

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.start = (time.perf_counter(), time.process_time())

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step % s.updates:
                return
            trl_times.append((time.perf_counter() - self.start[0], time.process_time() - self.start[1]))
            r = state.global_step // s.updates - 1
            if len(trl_tokens) != r + 1:  # the per-token figures need each generation's lengths
                raise RuntimeError(f"TRL's reward function saw {len(trl_tokens)} generations' completion_ids "
                                   f"by round {r}, expected {r + 1}")
            hacfed_times.append(hacfed.round(r, rounds[r]))
            kind = "warm-up" if r < s.warmup else "round"
            (tw, tc), (hw, hc) = trl_times[-1], hacfed_times[-1]
            print(f"{kind} {r}: TRL {tw:.2f}s (CPU {tc:.2f}s), hacfed {hw:.2f}s (CPU {hc:.2f}s)",
                  file=sys.stderr, flush=True)
            self.start = (time.perf_counter(), time.process_time())

    trainer = trl.GRPOTrainer(model=loaded.model, reward_funcs=reward, args=args, train_dataset=dataset,
                              processing_class=loaded.tokenizer, callbacks=[Alternate()],
                              peft_config=trl_peft_config(s, hacfed.cfg))
    trainer.train()
    if len(trl_times) != s.total_rounds:
        raise RuntimeError(f"TRL ran {len(trl_times)} rounds, expected {s.total_rounds}")
    summary = measured_summary(s, hacfed_times, trl_times, hacfed.tokens, trl_tokens)
    summary.update(settings=asdict(s), torch_threads=torch.get_num_threads(), trl_version=trl.__version__,
                   hacfed_reward_mean=hacfed.rewards[s.warmup:])
    return summary


def measured_summary(s: BenchSettings, hacfed_times: Sequence[tuple[float, float]],
                     trl_times: Sequence[tuple[float, float]], hacfed_tokens: Sequence[float],
                     trl_tokens: Sequence[float]) -> dict[str, Any]:
    """The measured rounds' ratios (warm-up rounds left out): by wall and CPU time, per completion
    and per completion token, with each side's mean completion lengths."""
    measured_h, measured_t = hacfed_times[s.warmup:], trl_times[s.warmup:]
    summary = summarize([w for w, _ in measured_h], [w for w, _ in measured_t], s.completions_per_round)
    # One thread: process CPU time is what each side computed, whatever else ran on the cores.
    summary["cpu"] = summarize([c for _, c in measured_h], [c for _, c in measured_t], s.completions_per_round)
    lengths = list(hacfed_tokens[s.warmup:]), list(trl_tokens[s.warmup:])
    summary["per_token"] = per_token([w for w, _ in measured_h], [w for w, _ in measured_t], s.completions_per_round,
                                     *lengths)
    summary["cpu_per_token"] = per_token([c for _, c in measured_h], [c for _, c in measured_t],
                                         s.completions_per_round, *lengths)
    summary.update(hacfed_completion_tokens=lengths[0], trl_completion_tokens=lengths[1])
    return summary


def _loaded_mismatches(participant: Any, trl_model: Any) -> list[str]:
    """What the two loaded models disagree on: the weights' dtype; hacfed checkpointing activations."""
    problems = []
    if participant.memory.gradient_checkpointing:
        problems.append("activation checkpointing (hacfed): True, want False (a model above 300M parameters)")
    ours, theirs = next(participant.model.parameters()).dtype, next(trl_model.parameters()).dtype
    if ours != theirs:
        problems.append(f"weights dtype: hacfed {ours}, TRL {theirs}")
    return problems


def parse_args(argv: Sequence[str] | None) -> tuple[BenchSettings, str | None]:
    d = BenchSettings()
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=d.model, help=f"hacfed model preset (default {d.model})")
    ap.add_argument("--task", default=d.task, choices=TASKS, help=f"default {d.task} (chain: use a chain-* model)")
    ap.add_argument("--finetune", default=d.finetune, choices=FINETUNES, help=f"both sides (default {d.finetune})")
    ap.add_argument("--prompts", type=int, default=d.prompts, help=f"prompts per round (default {d.prompts})")
    ap.add_argument("--group-size", type=int, default=d.group_size, help=f"G (default {d.group_size})")
    ap.add_argument("--updates", type=int, default=d.updates, help=f"optimizer updates per round (default {d.updates})")
    ap.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens, help=f"default {d.max_new_tokens}")
    ap.add_argument("--rounds", type=int, default=d.rounds, help=f"measured rounds per side (default {d.rounds})")
    ap.add_argument("--warmup", type=int, default=d.warmup, help=f"uncounted first rounds (default {d.warmup})")
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--json", default=None, help="also write the summary to this JSON file")
    a = ap.parse_args(argv)
    try:
        s = BenchSettings(model=a.model, task=a.task, finetune=a.finetune, prompts=a.prompts,
                          group_size=a.group_size, updates=a.updates,
                          max_new_tokens=a.max_new_tokens, rounds=a.rounds, warmup=a.warmup, seed=a.seed)
    except ValueError as exc:
        ap.error(str(exc))
    return s, a.json


def main(argv: Sequence[str] | None = None) -> int:
    s, json_path = parse_args(argv)
    _trl_or_exit()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one thread on both sides
    with tempfile.TemporaryDirectory(prefix="hacfed-trl-bench-") as out_dir:
        summary = run(s, out_dir)
    print(format_summary(summary))
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
