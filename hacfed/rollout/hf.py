"""Rollouts with Hugging Face `model.generate`, returning what HACPO needs from each sample.

Every sample comes back with the log-prob of each of its tokens under the *tempered policy*
softmax(logits / T) at the sampling temperature T, read from each step's raw logits as generation
goes (`StepLogprobs`: only the drawn token's log-prob is kept, not the step's logits), EOS
excluded: the distribution the tokens were drawn from (with top_p 1 and no top-k, the federation's
settings). That is the `source_logp_sum` a participant publishes; the learner scores the same
tempered policy in its update (`hacfed.rollout.logprobs.sequence_logprobs(temperature=T)`), so
both sides of every ratio are log-probs of one distribution. top_p < 1 truncates the sampling
distribution, which the log-probs do not follow.

Two transformers behaviours would silently bias importance ratios, so both are switched off:
  * the library default `top_k=50` (we pass `top_k=0`, i.e. no truncation), and
  * sampling defaults stored with a checkpoint (`generation_config.json`, e.g. Qwen ships
    top_k=20 and a repetition penalty): they are hidden for the duration of the call, so only the
    arguments of `generate` decide the sampling distribution.

A response never runs past the model's context (`max_position_embeddings`): a prompt that leaves
less room than max_new_tokens gets the room left (finish reason "length" when it is used up), and
one that alone fills the context is cut from the left (`fit_to_context`), so a small model still
answers every prompt of a plan with long prompts (its groups stay complete; its cuts are counted,
and its own samples of a prompt it cannot read whole are not trained on: hacfed.clients.context).

Prompts are rendered with the tokenizer's chat template and left-padded; transformers derives
position ids from the attention mask, so a padded prompt is seen at the same positions as an
unpadded one (tests/unit/test_logprobs.py checks this against a teacher-forced recomputation).

    groups = generate(model, tokenizer, [[ChatMessage("user", "2+3=")]], num_samples=8, seed=0)
    groups[0][0].text, groups[0][0].logprob_sum
"""

from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch
from torch import Tensor
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

from hacfed.rollout.logprobs import gather_token_logprobs
from hacfed.trajectory import FINISH_REASONS, ChatMessage, FinishReason, render_prompt_ids

log = logging.getLogger("hacfed.rollout.hf")


@dataclass(frozen=True)
class Completion:
    """One sampled response. token_ids/logprobs exclude EOS and any padding after it."""

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason

    def __post_init__(self) -> None:
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"Completion.finish_reason must be one of {FINISH_REASONS}, got {self.finish_reason!r}")
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(
                f"Completion has {len(self.token_ids)} token ids but {len(self.logprobs)} log-probs"
            )

    @property
    def logprob_sum(self) -> float:
        return math.fsum(self.logprobs)


def _check_positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")


def validate_generate_args(num_samples: int, max_new_tokens: int, temperature: float, top_p: float,
                   batch_size: int, seed: int | None) -> None:
    _check_positive_int("num_samples", num_samples)
    _check_positive_int("max_new_tokens", max_new_tokens)
    _check_positive_int("batch_size", batch_size)
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    if not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ValueError(f"seed must be an int or None, got {seed!r}")


def special_token_ids(tokenizer: Any) -> tuple[int, int]:
    """(eos_id, pad_id). A tokenizer without a pad token pads with EOS (masked out anyway)."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError(f"tokenizer {type(tokenizer).__name__} has no eos_token_id; cannot detect stops")
    pad = tokenizer.pad_token_id
    return eos, eos if pad is None else pad


def generation_config(*, max_new_tokens: int, temperature: float, top_p: float, greedy: bool,
                      eos_id: int, pad_id: int) -> GenerationConfig:
    """The complete sampling setup handed to `model.generate`; nothing else may add to it."""
    common = dict(
        max_new_tokens=max_new_tokens, eos_token_id=eos_id, pad_token_id=pad_id, num_beams=1,
        num_return_sequences=1, use_cache=True, return_dict_in_generate=True, output_logits=False,
    )
    if greedy:
        return GenerationConfig(do_sample=False, **common)
    # top_k=0 disables top-k; leaving it None would let transformers fill in its default of 50.
    return GenerationConfig(do_sample=True, temperature=float(temperature), top_k=0, top_p=float(top_p), **common)


@contextlib.contextmanager
def _checkpoint_generation_defaults_hidden(model: Any) -> Iterator[None]:
    """Hide the checkpoint's `generation_config` so none of its sampling defaults fill our unset fields.

    transformers copies every field we leave None from `model.generation_config`. PEFT wrappers
    delegate `generate` to the underlying transformers model, whose config is the one read (and
    which PeftModelForCausalLM.generate overwrites with the wrapper's view of it), so the swap and
    the restore both target that inner model.
    """
    target = model.get_base_model() if hasattr(model, "get_base_model") else model
    saved = target.generation_config
    target.generation_config = GenerationConfig()
    try:
        yield
    finally:
        target.generation_config = saved


@contextlib.contextmanager
def _seeded(seed: int | None, device: torch.device) -> Iterator[None]:
    """Seed sampling without disturbing the caller's global RNG streams (restored on exit)."""
    if seed is None:
        yield
        return
    if device.type == "cpu":
        devices = []
    elif device.type == "cuda":
        devices = [device.index if device.index is not None else torch.cuda.current_device()]
    else:
        raise ValueError(f"seeded sampling supports cpu and cuda models, got device {device}")
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


@contextlib.contextmanager
def _eval_mode(model: Any) -> Iterator[None]:
    """Sampling must not see dropout; restore the caller's train/eval mode afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def left_pad(prompt_ids: Sequence[Sequence[int]], pad_id: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Left-padded input ids and attention mask, both (B, Lp)."""
    width = max(len(p) for p in prompt_ids)
    input_ids = torch.full((len(prompt_ids), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for row, ids in enumerate(prompt_ids):
        input_ids[row, width - len(ids):] = torch.as_tensor(list(ids), dtype=torch.long)
        attention_mask[row, width - len(ids):] = 1
    return input_ids.to(device), attention_mask.to(device)


def context_limit(model: Any) -> int | None:
    """The most positions `model` reads (prompt + response), or None when its config does not say."""
    limit = getattr(model.config, "max_position_embeddings", None)
    return limit if isinstance(limit, int) and limit > 0 else None


def fit_to_context(prompt_ids: Sequence[Sequence[int]], max_new_tokens: int,
                   limit: int | None) -> list[tuple[int, int]]:
    """(prompt tokens kept, response budget) per prompt. The budget is max_new_tokens, cut where the
    prompt plus its response would run past the model's context; a prompt that alone fills the
    context keeps only its last tokens (its end: the question's last words and the generation
    prompt), leaving an eighth of the context (at most max_new_tokens) to answer in. A cut response
    ends with finish reason "length", as one cut at max_new_tokens does, so it counts as truncated."""
    if limit is None:
        return [(len(ids), max_new_tokens) for ids in prompt_ids]
    floor = max(1, min(max_new_tokens, limit // 8))
    return [(len(ids), min(max_new_tokens, limit - len(ids))) if len(ids) < limit else (limit - floor, floor)
            for ids in prompt_ids]


def _to_completions(tokenizer: Any, new_tokens: Tensor, token_logprobs: Tensor, eos_id: int) -> list[Completion]:
    """Cut each row at its first EOS. new_tokens (B, T) int, token_logprobs (B, T) float."""
    completions = []
    for ids, logps in zip(new_tokens.tolist(), token_logprobs.tolist()):
        if eos_id in ids:
            cut, finish = ids.index(eos_id), "stop"
        else:
            cut, finish = len(ids), "length"
        kept = tuple(ids[:cut])
        text = tokenizer.decode(list(kept), skip_special_tokens=True)
        completions.append(Completion(text, kept, tuple(logps[:cut]), finish))
    return completions


class StepLogprobs(LogitsProcessor):
    """The log-prob under the tempered policy of each token `generate` draws, kept as it goes.

    Called with each step's raw logits (B, V) before the sampler's own processors (transformers runs
    a caller's processors ahead of its temperature and top-k/top-p warpers, which return new
    tensors), it holds them only until the next step shows the token drawn from them (the last
    column of `input_ids`), so a batch holds one step's logits instead of every step's
    (`output_logits`: batch x max_new_tokens x vocab). Returns the scores unchanged."""

    def __init__(self, temperature: float) -> None:
        self.temperature = temperature
        self._pending: Tensor | None = None  # this step's logits, until its token is drawn
        self._steps: list[Tensor] = []  # (B,) per step drawn so far

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        if self._pending is not None:
            self._steps.append(gather_token_logprobs(self._pending, input_ids[:, -1], self.temperature))
        self._pending = scores
        return scores

    def finish(self, new_tokens: Tensor) -> Tensor:
        """(B, T) log-probs of `new_tokens`, the (B, T) tokens generated; the last step's gathered here."""
        if self._pending is not None:
            self._steps.append(gather_token_logprobs(self._pending, new_tokens[:, -1], self.temperature))
            self._pending = None
        if len(self._steps) != new_tokens.shape[1]:
            raise RuntimeError(f"generate ran {len(self._steps)} steps for {new_tokens.shape[1]} tokens")
        return torch.stack(self._steps, dim=1)


def _generate_batch(model: Any, tokenizer: Any, prompt_ids: Sequence[Sequence[int]],
                    config: GenerationConfig, device: torch.device) -> list[Completion]:
    input_ids, attention_mask = left_pad(prompt_ids, config.pad_token_id, device)  # (B, Lp)
    # Each step's raw logits, tempered as the sampler tempered them -> log π_T of the token drawn.
    steps = StepLogprobs(float(config.temperature) if config.do_sample else 1.0)
    out = model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config,
                         logits_processor=LogitsProcessorList([steps]))
    new_tokens = out.sequences[:, input_ids.shape[1]:]  # (B, T)
    token_logprobs = steps.finish(new_tokens)  # (B, T)
    return _to_completions(tokenizer, new_tokens.cpu(), token_logprobs.cpu(), config.eos_token_id)


def generate(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Sequence[ChatMessage]],
    *,
    num_samples: int = 1,
    max_new_tokens: int = 16,
    temperature: float = 1.0,
    top_p: float = 1.0,
    greedy: bool = False,
    batch_size: int = 64,
    seed: int | None = None,
) -> list[list[Completion]]:
    """`num_samples` completions per prompt, as [prompt][sample].

    batch_size counts sequences (prompt × sample) per `model.generate` call; it bounds memory,
    which grows with batch × (prompt + max_new_tokens) for the KV cache and batch × vocab for one
    step's logits. With a seed the result
    is reproducible for the same batch_size; the caller's global RNG state is left untouched.
    `Completion.logprobs` are log-probs of the policy tempered at `temperature` (greedy: at 1), the
    distribution sampled from; `top_p` < 1 truncates it, which they do not follow (module docstring).
    """
    validate_generate_args(num_samples, max_new_tokens, temperature, top_p, batch_size, seed)
    if not prompts:
        return []
    eos_id, pad_id = special_token_ids(tokenizer)
    rendered = [render_prompt_ids(tokenizer, messages) for messages in prompts]
    for i, ids in enumerate(rendered):
        if not ids:
            raise ValueError(f"prompt {i} renders to no tokens")
    limit = context_limit(model)
    fitted = fit_to_context(rendered, max_new_tokens, limit)
    cut = [p for p, (_, b) in enumerate(fitted) if b < max_new_tokens]
    if cut:
        log.warning("%d of %d prompts leave less than max_new_tokens %d in the model's context of %s positions "
                    "(longest prompt %d tokens): their responses are cut there", len(cut), len(prompts),
                    max_new_tokens, limit, max(len(rendered[p]) for p in cut))
    rendered = [ids[len(ids) - keep:] for ids, (keep, _) in zip(rendered, fitted)]
    budgets = [b for _, b in fitted]
    device = next(model.parameters()).device
    groups: list[list[Completion]] = [[] for _ in prompts]
    # Prompts with the full budget first, in order (the batches of a context-free run), then each
    # shorter budget.
    for budget in sorted(set(budgets), reverse=True):
        owners = [p for p in range(len(prompts)) if budgets[p] == budget for _ in range(num_samples)]
        config = generation_config(max_new_tokens=budget, temperature=temperature, top_p=top_p,
                                   greedy=greedy, eos_id=eos_id, pad_id=pad_id)
        with torch.inference_mode(), _eval_mode(model), _checkpoint_generation_defaults_hidden(model), \
                _seeded(None if seed is None else seed + max_new_tokens - budget, device):
            for start in range(0, len(owners), batch_size):
                chunk = owners[start:start + batch_size]
                completions = _generate_batch(model, tokenizer, [rendered[p] for p in chunk], config, device)
                for p, completion in zip(chunk, completions):
                    groups[p].append(completion)
    return groups


def evaluate_sampled(model: Any, tokenizer: Any, task: Any, problems: Sequence[Any], *,
                     max_new_tokens: int = 16, batch_size: int = 128, seed: int = 0) -> float:
    """Sampled pass@1: mean verified reward of one temperature-1 sample per problem (seeded)."""
    if not problems:
        raise ValueError("evaluate_sampled needs at least one problem")
    groups = generate(model, tokenizer, [p.messages for p in problems], num_samples=1,
                      max_new_tokens=max_new_tokens, batch_size=batch_size, seed=seed)
    rewards = [task.verify(problem, group[0].text).reward for problem, group in zip(problems, groups)]
    return math.fsum(rewards) / len(rewards)
