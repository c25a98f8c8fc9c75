"""Microbatches sized by a token budget, for gradient accumulation inside one optimizer step.

A minibatch of a real model's samples (hundreds of tokens each, padded to the longest) can need
more activation memory than a device has. The minibatch stays what HACPO's schedule says (its
rows, its normalisation, one optimizer step); only its forward/backward is split into microbatches
whose padded size, rows x longest row, stays within `token_budget`, and their gradients add up.

    micro = split_by_tokens([120, 340, 90, 400], token_budget=800)   # [[0, 1], [2], [3]]
    micro = split_rows(prompt_lengths, response_lengths, token_budget=4096)   # as the update packs rows
    weights = accumulation_weights(micro, [120, 340, 90, 400], per="sequence")  # each microbatch's share

Rows keep their order (own samples first, as the update orders them), so a microbatch never mixes
rows from far apart. A single row longer than the budget is its own microbatch: the budget bounds
what can be bounded and never drops a sample.
"""

from __future__ import annotations

from typing import Literal, Sequence

Normalisation = Literal["sequence", "token"]


def split_by_tokens(lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Consecutive row indices grouped so each group's padded size (rows x longest row) is at most
    `token_budget`; a row longer than the budget alone is one group."""
    return split_rows([0] * len(lengths), lengths, token_budget)


def split_rows(prompt_lengths: Sequence[int], response_lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Like `split_by_tokens` for rows packed as the update packs them (`hacfed.rollout.logprobs`:
    prompts left-padded to the longest prompt, responses right-padded to the longest response), so
    a group's padded size is rows x (longest prompt + longest response)."""
    if isinstance(token_budget, bool) or not isinstance(token_budget, int) or token_budget < 1:
        raise ValueError(f"token_budget must be an int >= 1, got {token_budget!r}")
    if len(prompt_lengths) != len(response_lengths):
        raise ValueError(f"{len(prompt_lengths)} prompt lengths for {len(response_lengths)} responses")
    groups: list[list[int]] = []
    current: list[int] = []
    wide_p = wide_r = 0
    for i, (p, r) in enumerate(zip(prompt_lengths, response_lengths)):
        if any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in (p, r)) or p + r < 1:
            raise ValueError(f"row {i}: lengths must be ints, prompt + response >= 1, got {p!r} + {r!r}")
        if current and (len(current) + 1) * (max(wide_p, p) + max(wide_r, r)) > token_budget:
            groups.append(current)
            current, wide_p, wide_r = [], 0, 0
        current.append(i)
        wide_p, wide_r = max(wide_p, p), max(wide_r, r)
    if current:
        groups.append(current)
    return groups


def accumulation_weights(groups: Sequence[Sequence[int]], lengths: Sequence[int],
                         per: Normalisation = "sequence") -> list[float]:
    """Each microbatch's share of the minibatch's normalisation, so that sum over microbatches of
    weight x (the microbatch's own mean loss) is the minibatch's mean loss: rows for a loss averaged
    over sequences (GSPO, HACPO), tokens for one averaged over tokens (GRPO's token mean)."""
    if per not in ("sequence", "token"):
        raise ValueError(f"per must be 'sequence' or 'token', got {per!r}")
    sizes = [len(g) if per == "sequence" else sum(lengths[i] for i in g) for g in groups]
    total = sum(sizes)
    if total == 0:
        raise ValueError("accumulation_weights needs at least one row")
    return [s / total for s in sizes]


def padded_tokens(groups: Sequence[Sequence[int]], lengths: Sequence[int]) -> int:
    """Tokens the microbatches hold with padding (sum of rows x longest row): what memory follows."""
    return sum(len(g) * max(lengths[i] for i in g) for g in groups if g)
