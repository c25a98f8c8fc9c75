"""Warm-up pieces: completion-only labels, the teacher-forced screen, schedule, stopping, determinism."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from hacfed.models.warmup import (
    IGNORE_INDEX,
    WarmupConfig,
    collate,
    encode_example,
    lr_factor,
    name_causal_lm_loss,
    teacher_forced_exact_match,
    warm_up,
)
from hacfed.models.zoo import build_untrained
from hacfed.tasks.arithmetic import ArithmeticTask
from hacfed.trajectory import render_prompt_ids

TASK = ArithmeticTask(num_train=128, num_eval=16)


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models gain little from intra-op threads, and on a shared, oversubscribed CPU two
    spinning threads run several times slower than one."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def llama():
    return build_untrained("tiny-llama", seed=0)


def test_encode_example_is_chat_prompt_then_solution_and_eos(llama):
    _, tok = llama
    problem = TASK.train_problems()[0]
    prompt, completion = encode_example(tok, problem)
    assert prompt == render_prompt_ids(tok, problem.messages)
    assert tok.decode(completion[:-1]) == problem.solution
    assert completion[-1] == tok.eos_token_id


def test_collate_masks_prompt_and_padding():
    batch = collate([([5, 6, 7], [8, 9]), ([5], [4])], pad_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9], [5, 4, 0, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    x = IGNORE_INDEX
    assert batch["labels"].tolist() == [[x, x, x, 8, 9], [x, 4, x, x, x]]


def test_lr_factor_ramps_linearly_then_stays():
    assert [lr_factor(s, 4) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert lr_factor(0, 0) == 1.0


class _Oracle(torch.nn.Module):
    """Predicts `answers[row][t]` at every position: logits one-hot on the given next tokens."""

    def __init__(self, next_tokens: torch.Tensor, vocab: int = 16):
        super().__init__()
        self.next_tokens = next_tokens  # (B, T): token predicted at position t (for t+1)
        self.vocab = vocab

    def forward(self, input_ids, attention_mask):
        logits = torch.nn.functional.one_hot(self.next_tokens, self.vocab).float()  # (B, T, V)
        return SimpleNamespace(logits=logits)


def test_teacher_forced_screen_counts_rows_whose_every_completion_token_is_argmax():
    batch = collate([([1, 2], [3, 4]), ([1, 2], [5, 6])], pad_id=0)  # rows: 1 2 | 3 4 and 1 2 | 5 6
    # Position t predicts token t+1. Row 0 right everywhere; row 1 wrong at its last token (6 -> 7).
    predictions = torch.tensor([[2, 3, 4, 0], [2, 5, 7, 0]])
    assert teacher_forced_exact_match(_Oracle(predictions), batch) == 0.5
    # A wrong prediction inside the prompt does not matter: the prompt is not scored.
    predictions = torch.tensor([[9, 3, 4, 9], [9, 5, 6, 9]])
    assert teacher_forced_exact_match(_Oracle(predictions), batch) == 1.0


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


def test_warm_up_trains_deterministically_and_reports_cap():
    calls = []

    def evaluator(model, tok, task, problems, max_new_tokens):
        calls.append(len(problems))
        return 0.0

    config = WarmupConfig(max_steps=3, check_every=1, coarse_check_every=1, batch_size=16, lr_warmup_steps=2)
    runs = []
    for _ in range(2):
        model, tok = build_untrained("tiny-llama", seed=0)
        before = _params(model)
        result = warm_up(model, tok, TASK, config, seed=7, evaluate=evaluator, progress=False)
        runs.append(_params(model))
        assert any(not torch.equal(a, b) for a, b in zip(before, runs[-1]))  # it trained
        assert not model.training
    assert all(torch.equal(a, b) for a, b in zip(*runs))
    assert result.steps == 3 and not result.reached_target and result.accuracy == 0.0
    assert [s for s, _ in result.screens] == [1, 2, 3]
    assert result.checks == ((3, 0.0),)  # random model: screen 0, greedy check only at the cap
    assert calls == [16, 16]  # whole held-out split, once per run


def test_warm_up_stops_at_first_confirmed_in_band_check(monkeypatch):
    import hacfed.models.warmup as warmup_module

    screens = iter([0.1, 0.6, 0.4, 0.4])  # below, above (keep going), in band (confirm)
    monkeypatch.setattr(warmup_module, "teacher_forced_exact_match", lambda model, batch: next(screens))
    confirmations = iter([0.41])
    model, tok = build_untrained("tiny-llama", seed=0)
    config = WarmupConfig(max_steps=50, check_every=1, coarse_check_every=1, batch_size=16)
    result = warm_up(model, tok, TASK, config, seed=0, evaluate=lambda *a: next(confirmations), progress=False)
    assert result.steps == 3
    assert result.checks == ((3, 0.41),)
    assert result.reached_target and result.accuracy == 0.41


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(target_accuracy=0.5, max_accuracy=0.4), "target_accuracy <= max_accuracy"),
        (dict(max_steps=0), "max_steps must be an int >= 1"),
        (dict(check_every=True), "check_every must be an int >= 1"),
        (dict(learning_rate=0.0), "learning_rate > 0"),
        (dict(lr_warmup_steps=-1), "lr_warmup_steps must be >= 0"),
    ],
)
def test_warmup_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        WarmupConfig(**kwargs)


def test_warm_up_without_a_bar_prints_plain_progress_lines(monkeypatch, capsys):
    import hacfed.models.warmup as warmup_module

    config = WarmupConfig(max_steps=3, check_every=1, coarse_check_every=1, batch_size=16, lr_warmup_steps=2)
    model, tok = build_untrained("tiny-llama", seed=0)
    monkeypatch.setattr(warmup_module, "PLAIN_PROGRESS_EVERY_S", 0.0)  # a line at every step
    warm_up(model, tok, TASK, config, seed=7, evaluate=lambda *a: 0.0, progress=False, desc="warm-up tiny")
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3 and lines[0].startswith("[hacfed] warm-up tiny: step 1, stops at held-out 0.35, no "
                                                   "estimate before accuracy rises, loss ")
    assert "held-out 0.00 (stops at 0.35)" in lines[1]  # the screen of step 1, shown from step 2 on
    assert not any("at most" in line for line in lines)  # the cap is not the warm-up's length
    monkeypatch.setattr(warmup_module, "PLAIN_PROGRESS_EVERY_S", 3600.0)  # a short build says nothing
    warm_up(model, tok, TASK, config, seed=7, evaluate=lambda *a: 0.0, progress=False)
    assert capsys.readouterr().err == ""


def test_a_gpt2_warm_up_step_prints_no_loss_type_warning() -> None:
    import logging

    model, tok = build_untrained("tiny-gpt2", seed=0)
    assert model.loss_type is None  # GPT2LMHeadModel's name names no loss: transformers would warn
    warnings: list[str] = []
    catcher = logging.Handler(logging.WARNING)
    catcher.emit = lambda record: warnings.append(record.getMessage())  # type: ignore[method-assign]
    library = logging.getLogger("transformers")
    library.addHandler(catcher)
    logging.Logger.warning_once.cache_clear()  # transformers warns once per process: make this the first time
    try:
        name_causal_lm_loss(model)
        batch = collate([encode_example(tok, p) for p in TASK.train_problems()[:2]], tok.eos_token_id)
        assert torch.isfinite(model(**batch).loss)
    finally:
        library.removeHandler(catcher)
    assert not [w for w in warnings if "loss_type" in w], warnings
