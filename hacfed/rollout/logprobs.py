"""Teacher-forced log-probs of given responses under a causal LM (the trainer's scorer).

The HACPO update needs log π_θ(y_t | x, y_<t) for every response token of every pooled sample, own or
foreign. `sequence_logprobs` packs a batch as [left-padded prompt | right-padded response] so that
every response starts at the same column and one forward pass scores them all.

Position ids are always passed explicitly (`cumsum(attention_mask) - 1`, clamped at 0): models with
absolute position embeddings (GPT-2) would otherwise shift a left-padded prompt by its padding and
score a different sequence than the one that was sampled. Gradients flow through the result; wrap
the call in `torch.inference_mode()` when only values are needed.

`temperature` T scores the tempered policy softmax(logits / T), the distribution a rollout at T
samples from (as TRL and verl compute it): the sampler's summary, the learner's recomputed
log-probs and the reference's must all use the same T for a ratio to compare like with like.

    logp, mask = sequence_logprobs(model, [[5, 6, 7], [8]], [[9, 2], [3]], pad_id=0)  # (2, 2) each
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor


def positions_from_mask(attention_mask: Tensor) -> Tensor:
    """Position of each token counted over real tokens only; padding gets 0.  (B, L) -> (B, L)"""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def _validate(prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]]) -> None:
    if len(prompt_ids) != len(response_ids):
        raise ValueError(f"got {len(prompt_ids)} prompts but {len(response_ids)} responses")
    if not prompt_ids:
        raise ValueError("sequence_logprobs needs at least one sequence")
    for i, prompt in enumerate(prompt_ids):
        # The first response token is predicted from the last prompt position, so one must exist.
        if len(prompt) == 0:
            raise ValueError(f"sequence {i}: empty prompt; the first response token needs a context")


def pack_prompt_response(
    prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[Sequence[int]],
    pad_id: int,
    device: torch.device | str = "cpu",
) -> tuple[Tensor, Tensor, Tensor, int]:
    """[left-padded prompt | right-padded response] and its masks.

    Returns input_ids (B, Lp+Tr), attention_mask (B, Lp+Tr), response_mask (B, Tr) and Lp, the
    padded prompt width (response token j of every row sits at column Lp + j).
    """
    _validate(prompt_ids, response_ids)
    batch = len(prompt_ids)
    prompt_width = max(len(p) for p in prompt_ids)
    response_width = max(len(r) for r in response_ids)
    input_ids = torch.full((batch, prompt_width + response_width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    response_mask = torch.zeros((batch, response_width), dtype=torch.bool)
    for row, (prompt, response) in enumerate(zip(prompt_ids, response_ids)):
        start = prompt_width - len(prompt)
        input_ids[row, start:prompt_width] = torch.as_tensor(list(prompt), dtype=torch.long)
        attention_mask[row, start:prompt_width] = 1
        if response:
            end = prompt_width + len(response)
            input_ids[row, prompt_width:end] = torch.as_tensor(list(response), dtype=torch.long)
            attention_mask[row, prompt_width:end] = 1
            response_mask[row, : len(response)] = True
    return input_ids.to(device), attention_mask.to(device), response_mask.to(device), prompt_width


def gather_token_logprobs(logits: Tensor, tokens: Tensor, temperature: float = 1.0) -> Tensor:
    """log_softmax(logits / temperature)[token] in float32 without materialising a second (B, T, V)
    tensor. At temperature 1 the logits are used as they are.

    logits (..., V), tokens (...) -> (...)
    """
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    picked = logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def sequence_logprobs(
    model: Any,
    prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[Sequence[int]],
    pad_id: int,
    temperature: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """Per-token log π(response_t | prompt, response_<t) under `model`, teacher-forced, of the policy
    tempered at `temperature` (module docstring).

    Returns (logp, mask), both (B, T_resp) with T_resp the longest response: logp is float32 and 0
    where mask is False (padding beyond a row's response).
    """
    device = next(model.parameters()).device
    input_ids, attention_mask, response_mask, prompt_width = pack_prompt_response(
        prompt_ids, response_ids, pad_id, device
    )
    response_width = response_mask.shape[1]
    if response_width == 0:
        empty = torch.zeros((len(prompt_ids), 0), device=device)
        return empty, response_mask
    # Only the positions that predict response tokens need logits: columns Lp-1 .. Lp+Tr-2, i.e.
    # the last Tr+1 positions minus the final one (which predicts past the longest response).
    outputs = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=positions_from_mask(attention_mask),
        use_cache=False,
        logits_to_keep=response_width + 1,
    )
    if outputs.logits.shape[1] != response_width + 1:
        raise ValueError(
            f"{type(model).__name__} ignored logits_to_keep={response_width + 1} "
            f"(returned {outputs.logits.shape[1]} positions); it cannot be scored by sequence_logprobs"
        )
    logits = outputs.logits[:, :-1, :]  # (B, Tr, V)
    targets = input_ids[:, prompt_width:]  # (B, Tr)
    logp = gather_token_logprobs(logits, targets, temperature)  # (B, Tr)
    return logp.masked_fill(~response_mask, 0.0), response_mask
