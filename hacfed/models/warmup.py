"""Supervised warm-up: teach a freshly initialised zoo model the task format and a little skill.

RL from a random policy gets zero reward forever, and RL from a near-perfect policy has nothing left
to learn. So each preset is trained on the task's train split (prompt through the model's own chat
template, then the reference solution and EOS; loss on the completion tokens only) until its
held-out greedy accuracy first reaches a modest target (~0.4 on 2-digit addition), checked every
few steps, with a hard cap on steps.

    result = warm_up(model, tokenizer, ArithmeticTask(), WarmupConfig(), seed=0)
    result.accuracy, result.steps
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch
from tqdm.auto import tqdm

from hacfed.models.warmup_estimate import estimated_steps, progress_text
from hacfed.tasks.base import Problem, Task
from hacfed.trajectory import render_prompt_ids

PLAIN_PROGRESS_EVERY_S = 60.0  # a warm-up without a bar prints a line this often
IGNORE_INDEX = -100  # label value the HF causal-LM loss skips
Evaluator = Callable[[torch.nn.Module, object, Task, Sequence[Problem], int], float]


@dataclass(frozen=True)
class WarmupConfig:
    """Stop at the first check whose held-out greedy accuracy lies in [target_accuracy,
    max_accuracy]; a check above max_accuracy keeps training (a tiny model's accuracy oscillates,
    so it soon comes back through the band). max_steps: optimizer-step cap. check_every: steps
    between (cheap, teacher-forced) accuracy screens once a screen reaches half the target;
    coarse_check_every: before that. lr_warmup_steps: linear ramp of the
    learning rate from 0, constant afterwards. eval_max_new_tokens: generation budget of the
    greedy confirmation (a model that has not stopped by then is wrong). fixed_steps: train
    exactly max_steps steps and report the accuracy reached, with no band (the "size" pairs: same
    data and steps, different capacity). greedy_screens: screen with greedy accuracy instead of the
    teacher-forced exact match; for a task whose answer-only accuracy runs far ahead of exact
    reproduction of the worked solution (subtraction chains: greedy 0.50 while the screen read 0.30)."""

    target_accuracy: float = 0.35
    max_accuracy: float = 0.45
    max_steps: int = 1500
    check_every: int = 2
    coarse_check_every: int = 10
    batch_size: int = 64
    learning_rate: float = 1e-3
    lr_warmup_steps: int = 50
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    eval_max_new_tokens: int = 8
    fixed_steps: bool = False
    greedy_screens: bool = False  # screen with greedy accuracy itself (slower, exact)

    def __post_init__(self) -> None:
        if not 0.0 < self.target_accuracy <= self.max_accuracy <= 1.0:
            raise ValueError(
                "WarmupConfig needs 0 < target_accuracy <= max_accuracy <= 1, got "
                f"{self.target_accuracy!r}/{self.max_accuracy!r}"
            )
        for name in ("max_steps", "check_every", "coarse_check_every", "batch_size", "eval_max_new_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"WarmupConfig.{name} must be an int >= 1, got {value!r}")
        if not (self.learning_rate > 0 and self.max_grad_norm > 0 and self.weight_decay >= 0):
            raise ValueError(
                f"WarmupConfig needs learning_rate > 0, max_grad_norm > 0, weight_decay >= 0, got "
                f"{self.learning_rate!r}/{self.max_grad_norm!r}/{self.weight_decay!r}"
            )
        if self.lr_warmup_steps < 0:
            raise ValueError(f"WarmupConfig.lr_warmup_steps must be >= 0, got {self.lr_warmup_steps!r}")

    def in_band(self, accuracy: float) -> bool:
        return self.fixed_steps or self.target_accuracy <= accuracy <= self.max_accuracy


@dataclass(frozen=True)
class WarmupResult:
    steps: int  # optimizer steps taken
    accuracy: float  # held-out greedy accuracy of the returned model
    reached_target: bool  # accuracy lies in the config's [target_accuracy, max_accuracy] band
    seconds: float
    screens: tuple[tuple[int, float], ...]  # (step, teacher-forced held-out exact match)
    checks: tuple[tuple[int, float], ...]  # (step, greedy held-out accuracy) confirmations


def encode_example(tokenizer, problem: Problem) -> tuple[list[int], list[int]]:
    """(prompt ids ending with the generation prompt, completion ids = solution + EOS)."""
    if tokenizer.eos_token_id is None:
        raise ValueError("warm-up needs a tokenizer with an eos token")
    prompt = render_prompt_ids(tokenizer, problem.messages)
    completion = list(tokenizer(problem.solution, add_special_tokens=False)["input_ids"])
    return prompt, completion + [tokenizer.eos_token_id]


def collate(examples: Sequence[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded batch; labels are IGNORE_INDEX on prompt and padding so only completions count."""
    width = max(len(p) + len(c) for p, c in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)  # (B, T)
    labels = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)  # (B, T)
    attention_mask = torch.zeros((len(examples), width), dtype=torch.long)  # (B, T)
    for row, (prompt, completion) in enumerate(examples):
        ids = prompt + completion
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, len(prompt) : len(ids)] = torch.tensor(completion)
        attention_mask[row, : len(ids)] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def teacher_forced_exact_match(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> float:
    """Fraction of rows whose every completion token (EOS included) is the argmax given the gold prefix.

    For a deterministic model this is exactly "greedy decoding reproduces solution + EOS", at the
    cost of one forward pass instead of a generate loop, so it can screen every few steps; a
    screen that reaches the target is then confirmed with real greedy generation.
    """
    with torch.inference_mode():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits  # (B, T, V)
    predicted = logits[:, :-1].argmax(dim=-1)  # (B, T-1): prediction for position t+1
    labels = batch["labels"][:, 1:]  # (B, T-1)
    scored = labels != IGNORE_INDEX
    correct = (predicted == labels) | ~scored  # (B, T-1)
    return correct.all(dim=1).float().mean().item()


def lr_factor(step: int, warmup_steps: int) -> float:
    """Linear ramp over the first `warmup_steps` optimizer steps (step counts from 0), then 1."""
    return 1.0 if warmup_steps == 0 else min(1.0, (step + 1) / warmup_steps)


def default_evaluator(model, tokenizer, task: Task, problems: Sequence[Problem], max_new_tokens: int) -> float:
    """Greedy held-out accuracy with the shared rollout engine (the same code RL evaluates with)."""
    from hacfed.rollout.greedy_eval import evaluate_accuracy

    return evaluate_accuracy(model, tokenizer, task, problems, max_new_tokens=max_new_tokens)


def _to(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {key: value.to(device) for key, value in batch.items()}


def name_causal_lm_loss(model: torch.nn.Module) -> None:
    """Name the loss the warm-up trains with. transformers derives it from the class name, finds none
    in `GPT2LMHeadModel`, warns "`loss_type=None` was set in the config but it is unrecognized" and
    falls back to this same causal-LM cross-entropy: naming it changes nothing but the warning."""
    if getattr(model, "loss_type", "ForCausalLM") is None:
        model.loss_type = "ForCausalLM"


def _train_step(model, optimizer, scheduler, batch: dict[str, torch.Tensor], max_grad_norm: float) -> float:
    model.train()
    loss = model(**batch).loss  # mean cross-entropy over the batch's completion tokens
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    scheduler.step()
    return loss.item()


def _held_out(task: Task) -> Sequence[Problem]:
    """The problems the stop is judged on: the validation split when the task has one, so no
    choice ever looks at the test split."""
    validation = task.validation_problems() if hasattr(task, "validation_problems") else ()
    return validation or task.eval_problems()


def _batches(train: Sequence[tuple[list[int], list[int]]], batch_size: int, pad_id: int,
             device: torch.device, seed: int) -> Iterator[dict[str, torch.Tensor]]:
    """Endless training batches: a fresh shuffle each epoch, deterministic in `seed`."""
    generator = torch.Generator().manual_seed(seed)
    order, cursor = torch.randperm(len(train), generator=generator), 0
    while True:
        if cursor + batch_size > len(order):  # new epoch, fresh shuffle
            order, cursor = torch.randperm(len(train), generator=generator), 0
        rows = order[cursor : cursor + batch_size].tolist()
        cursor += batch_size
        yield _to(collate([train[i] for i in rows], pad_id), device)


class _Progress:
    """The bar, or, without one (off a terminal: a log file, CI, nohup), a plain line to stderr at
    most every PLAIN_PROGRESS_EVERY_S, so a ten-minute warm-up is never silent."""

    def __init__(self, config: WarmupConfig, desc: str, enabled: bool, start: float) -> None:
        self.config, self.desc, self.start = config, desc, start
        # No total until the screens give an estimate: the cap (max_steps) is not how long it takes.
        self.bar = tqdm(total=config.max_steps if config.fixed_steps else None, desc=desc, unit="step",
                        disable=not enabled, leave=False)
        self.next_line = start + PLAIN_PROGRESS_EVERY_S

    def stepped(self, step: int, loss: float, screens: Sequence[tuple[int, float]]) -> None:
        self.bar.update(1)
        if self.bar.disable and time.monotonic() >= self.next_line:
            self.next_line = time.monotonic() + PLAIN_PROGRESS_EVERY_S
            cfg = self.config
            where = progress_text(step, screens, cfg.target_accuracy, cfg.max_steps, cfg.fixed_steps)
            print(f"[hacfed] {self.desc}: {where}, loss {loss:.3f}, {time.monotonic() - self.start:.0f} s",
                  file=sys.stderr, flush=True)

    def screened(self, step: int, loss: float, screen: float, screens: Sequence[tuple[int, float]]) -> None:
        cfg = self.config
        self.bar.set_postfix(loss=f"{loss:.3f}", screen=f"{screen:.2f}", stops_at=f"{cfg.target_accuracy:.2f}")
        if (estimate := estimated_steps(screens, cfg.target_accuracy, cfg.max_steps)) is not None:
            self.bar.total = max(estimate, step)  # about how many steps in all, from the screens so far
            self.bar.refresh()

    def close(self) -> None:
        self.bar.close()


def warm_up(
    model: torch.nn.Module,
    tokenizer,
    task: Task,
    config: WarmupConfig,
    seed: int,
    *,
    evaluate: Evaluator = default_evaluator,
    progress: bool = True,
    desc: str = "warm-up",
) -> WarmupResult:
    """Train `model` in place until held-out greedy accuracy lies in the config's target band.

    Every `check_every` steps a teacher-forced screen estimates held-out accuracy; when it is in
    the band, `evaluate` (greedy generation) confirms it and training stops. Frequent cheap
    checks matter: greedy accuracy of a tiny model can jump by 0.15 in five steps, and stopping
    late overshoots the band RL needs. Deterministic in `seed` (data order; zoo models have no
    dropout). Leaves the model in eval mode. Without a bar (`progress` off, or off a terminal),
    it prints one plain line to stderr at most every `PLAIN_PROGRESS_EVERY_S`.
    """
    start = time.monotonic()
    if len(task.train_problems()) < config.batch_size:
        raise ValueError(f"task {task.name} has {len(task.train_problems())} train problems "
                         f"< batch_size {config.batch_size}")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    train = [encode_example(tokenizer, p) for p in task.train_problems()]
    held_out = _held_out(task)
    device = next(model.parameters()).device
    name_causal_lm_loss(model)
    held_out_batch = _to(collate([encode_example(tokenizer, p) for p in held_out], pad_id), device)
    batches = _batches(train, config.batch_size, pad_id, device, seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, config.lr_warmup_steps))
    screens: list[tuple[int, float]] = []
    checks: list[tuple[int, float]] = []
    step, next_check = 0, config.coarse_check_every
    shown = _Progress(config, desc, progress, start)
    try:
        while step < config.max_steps:
            loss = _train_step(model, optimizer, scheduler, next(batches), config.max_grad_norm)
            step += 1
            shown.stepped(step, loss, screens)
            if step < next_check or config.fixed_steps:
                continue
            model.eval()
            if config.greedy_screens:
                screen = float(evaluate(model, tokenizer, task, held_out, config.eval_max_new_tokens))
            else:
                screen = teacher_forced_exact_match(model, held_out_batch)
            near = screen >= config.target_accuracy / 2
            next_check = step + (config.check_every if near else config.coarse_check_every)
            screens.append((step, screen))
            shown.screened(step, loss, screen, screens)
            if config.target_accuracy <= screen <= config.max_accuracy:
                checks.append((step, float(evaluate(model, tokenizer, task, held_out, config.eval_max_new_tokens))))
                if config.in_band(checks[-1][1]):
                    break
        if not checks or checks[-1][0] != step:  # the cap was hit: report the final model's accuracy
            model.eval()
            checks.append((step, float(evaluate(model, tokenizer, task, held_out, config.eval_max_new_tokens))))
    finally:
        shown.close()
        model.eval()
    accuracy = checks[-1][1]
    return WarmupResult(
        steps=step, accuracy=accuracy, reached_target=config.in_band(accuracy),
        seconds=time.monotonic() - start, screens=tuple(screens), checks=tuple(checks),
    )
