"""Greedy held-out evaluation: batched decoding with a KV cache, each sequence stopped at its end.

    rewards = greedy_rewards(model, tokenizer, task, problems, max_new_tokens=48)
    accuracy = evaluate_accuracy(model, tokenizer, task, problems, max_new_tokens=48)

The answers are those of `hacfed.rollout.hf.generate(..., greedy=True)`: the same rendered prompts
cut to the same context (`fit_to_context`), the same argmax at each step (the first index of a
tie, as transformers' greedy search), the same stop at EOS or at the budget. Only the work differs:

  * prompts are sorted by length before they are batched, so a batch pads little;
  * each step feeds only the rows still running: a row that has emitted EOS or used its budget
    leaves the batch, and its KV cache rows with it (`DynamicCache.batch_select_indices`), where
    `model.generate` keeps computing every row until the last one stops;
  * only the last position's logits are computed (`logits_to_keep=1`), and none are stored.

Position ids count real tokens only (`positions_from_mask`), as transformers derives them from the
attention mask in `generate`, so a padded prompt is read at the same positions as an unpadded one.
The torch thread count is the caller's (`torch.set_num_threads`; `hacfed sim --threads`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor
from transformers import DynamicCache

from hacfed.rollout.hf import Completion, context_limit, fit_to_context, left_pad, special_token_ids
from hacfed.rollout.logprobs import gather_token_logprobs, positions_from_mask
from hacfed.trajectory import ChatMessage, render_prompt_ids


def greedy_generate(model: Any, tokenizer: Any, prompts: Sequence[Sequence[ChatMessage]], *,
                    max_new_tokens: int = 16, batch_size: int = 64) -> list[Completion]:
    """The greedy completion of each prompt, in the prompts' order (module docstring).

    batch_size bounds the rows decoded together; memory grows with it through the KV cache.
    """
    for name, value in (("max_new_tokens", max_new_tokens), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    eos_id, pad_id = special_token_ids(tokenizer)
    rendered = [render_prompt_ids(tokenizer, messages) for messages in prompts]
    for i, ids in enumerate(rendered):
        if not ids:
            raise ValueError(f"prompt {i} renders to no tokens")
    fitted = fit_to_context(rendered, max_new_tokens, context_limit(model))
    rendered = [ids[len(ids) - keep:] for ids, (keep, _) in zip(rendered, fitted)]
    decoder = _Decoder(model, eos_id, pad_id, [budget for _, budget in fitted])
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            decoder.run(rendered, batch_size)
    finally:
        model.train(was_training)
    return [Completion(tokenizer.decode(ids, skip_special_tokens=True), tuple(ids), tuple(logps), finish)
            for ids, logps, finish in zip(decoder.tokens, decoder.logps, decoder.finish)]


@dataclass
class _Rows:
    """The rows being decoded: their prompt indices, KV cache, attention mask (B, W) and next position (B, 1)."""

    prompts: list[int]
    cache: DynamicCache
    attention_mask: Tensor
    next_position: Tensor

    def select(self, keep: list[int]) -> None:
        index = torch.tensor(keep, dtype=torch.long, device=self.attention_mask.device)
        self.cache.batch_select_indices(index)
        self.attention_mask = self.attention_mask.index_select(0, index)
        self.next_position = self.next_position.index_select(0, index)
        self.prompts = [self.prompts[row] for row in keep]
        # Columns no row reads any more (the finished rows' oldest tokens) leave the cache.
        first = int(self.attention_mask.any(dim=0).long().argmax())
        if first:
            layers = [(k[:, :, first:], v[:, :, first:]) for k, v in _layers(self.cache)]
            self.cache = DynamicCache(ddp_cache_data=layers)
            self.attention_mask = self.attention_mask[:, first:]


class _Decoder:
    """Greedy decoding of sorted prompts with a refilled batch: when half the rows have stopped, the
    next prompts are read and join the running rows, left-padded to their width."""

    def __init__(self, model: Any, eos_id: int, pad_id: int, budgets: list[int]) -> None:
        self.model, self.eos_id, self.pad_id, self.budgets = model, eos_id, pad_id, budgets
        self.device = next(model.parameters()).device
        self.tokens: list[list[int]] = [[] for _ in budgets]
        self.logps: list[list[float]] = [[] for _ in budgets]
        self.finish = ["length"] * len(budgets)

    def run(self, prompt_ids: list[list[int]], batch_size: int) -> None:
        pending = sorted(range(len(prompt_ids)), key=lambda i: (len(prompt_ids[i]), i))
        rows: _Rows | None = None
        logits = torch.empty(0)
        while pending or rows is not None:
            live = 0 if rows is None else len(rows.prompts)
            if pending and live <= batch_size // 2:
                joining, pending = pending[:batch_size - live], pending[batch_size - live:]
                new_rows, new_logits = self._prefill(joining, [prompt_ids[i] for i in joining])
                rows, logits = (new_rows, new_logits) if rows is None else \
                    (_merge(rows, new_rows), torch.cat([logits, new_logits]))
            assert rows is not None
            chosen = self._choose(rows.prompts, logits)  # (B,) with -1 where a row stopped
            keep = [row for row, token in enumerate(chosen.tolist()) if token >= 0]
            if not keep:
                rows = None
                continue
            if len(keep) < len(rows.prompts):
                rows.select(keep)
                chosen = chosen[keep]
            rows.attention_mask = torch.cat([rows.attention_mask, rows.attention_mask.new_ones((len(keep), 1))], 1)
            logits = self.model(input_ids=chosen[:, None], attention_mask=rows.attention_mask,
                                position_ids=rows.next_position, past_key_values=rows.cache, use_cache=True,
                                logits_to_keep=1).logits[:, -1, :]  # (B, V)
            rows.next_position = rows.next_position + 1

    def _choose(self, prompts: list[int], logits: Tensor) -> Tensor:
        """Record each row's argmax token; returns it, or -1 for a row that stopped (EOS or budget)."""
        chosen = logits.argmax(dim=-1)  # (B,)
        chosen_logp = gather_token_logprobs(logits.float(), chosen).tolist()  # (B,)
        out = chosen.clone()
        for row, (p, token) in enumerate(zip(prompts, chosen.tolist())):
            if token == self.eos_id:
                self.finish[p] = "stop"
                out[row] = -1
                continue
            self.tokens[p].append(token)
            self.logps[p].append(chosen_logp[row])
            if len(self.tokens[p]) >= self.budgets[p]:
                out[row] = -1
        return out

    def _prefill(self, prompts: list[int], prompt_ids: list[list[int]]) -> tuple[_Rows, Tensor]:
        """Read the prompts: their rows and the logits of each one's last position (B, V)."""
        cache = DynamicCache(config=self.model.config)
        shared = shared_prefix_length(prompt_ids)
        if shared:  # the rows' common start, read once and its KV cache rows repeated for every row
            prefix = torch.tensor([prompt_ids[0][:shared]], dtype=torch.long, device=self.device)  # (1, P)
            self.model(input_ids=prefix, attention_mask=torch.ones_like(prefix),
                       position_ids=torch.arange(shared, device=self.device)[None, :], past_key_values=cache,
                       use_cache=True, logits_to_keep=1)
            cache.batch_repeat_interleave(len(prompt_ids))
        # [shared prefix | left-padded rest]: the padding sits between the two, masked out.
        input_ids, rest_mask = left_pad([ids[shared:] for ids in prompt_ids], self.pad_id, self.device)  # (B, Lr)
        attention_mask = torch.cat([rest_mask.new_ones((len(prompt_ids), shared)), rest_mask], dim=1)  # (B, P+Lr)
        positions = positions_from_mask(attention_mask)  # (B, P+Lr)
        logits = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions[:, shared:],
                            past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1, :]  # (B, V)
        return _Rows(list(prompts), cache, attention_mask, positions[:, -1:] + 1), logits


def _layers(cache: DynamicCache) -> list[tuple[Tensor, Tensor]]:
    """Each layer's (keys, values), (B, heads, W, head_dim); a sliding-window cache is refused."""
    out = []
    for keys, values, sliding in cache:
        if sliding is not None:
            raise ValueError("greedy evaluation supports full-attention caches only, got a sliding-window layer")
        out.append((keys, values))
    return out


def _merge(a: _Rows, b: _Rows) -> _Rows:
    """a's rows then b's, the narrower left-padded (masked out) to the wider's width."""
    width = max(a.attention_mask.shape[1], b.attention_mask.shape[1])

    def widen(t: Tensor, dim: int) -> Tensor:
        missing = width - t.shape[dim]
        if not missing:
            return t
        shape = list(t.shape)
        shape[dim] = missing
        return torch.cat([t.new_zeros(shape), t], dim=dim)

    layers = [(torch.cat([widen(ka, 2), widen(kb, 2)]), torch.cat([widen(va, 2), widen(vb, 2)]))
              for (ka, va), (kb, vb) in zip(_layers(a.cache), _layers(b.cache))]
    return _Rows(a.prompts + b.prompts, DynamicCache(ddp_cache_data=layers),
                 torch.cat([widen(a.attention_mask, 1), widen(b.attention_mask, 1)]),
                 torch.cat([a.next_position, b.next_position]))


def shared_prefix_length(prompt_ids: Sequence[Sequence[int]]) -> int:
    """Tokens every prompt starts with, leaving each at least its last token (whose logits start the answer)."""
    limit = min(len(ids) for ids in prompt_ids) - 1
    first = prompt_ids[0]
    for n in range(limit):
        if any(ids[n] != first[n] for ids in prompt_ids):
            return n
    return max(limit, 0)


def greedy_rewards(model: Any, tokenizer: Any, task: Any, problems: Sequence[Any], *,
                   max_new_tokens: int = 16, batch_size: int = 64) -> list[float]:
    """The verified reward of the greedy completion of each problem, in order."""
    if not problems:
        raise ValueError("greedy evaluation needs at least one problem")
    completions = greedy_generate(model, tokenizer, [p.messages for p in problems],
                                  max_new_tokens=max_new_tokens, batch_size=batch_size)
    return [task.verify(problem, c.text).reward for problem, c in zip(problems, completions)]


def evaluate_accuracy(model: Any, tokenizer: Any, task: Any, problems: Sequence[Any], *,
                      max_new_tokens: int = 16, batch_size: int = 64) -> float:
    """Mean verified reward of greedy completions over `problems` (held-out accuracy)."""
    rewards = greedy_rewards(model, tokenizer, task, problems, max_new_tokens=max_new_tokens, batch_size=batch_size)
    return math.fsum(rewards) / len(rewards)

