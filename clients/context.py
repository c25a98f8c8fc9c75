"""What a learner can read: the pool's samples that fit its model's context.

Runs in a lab's participant (`hacfed.clients.participant`) before each update. A learner trains on
prompt + response, so a sample longer than its context (`max_position_embeddings`) cannot be
trained on: a model with learnt positions (GPT-2) fails on it and a rotary one (Llama, Qwen2)
sees positions it never learnt. Such a sample is left out of the update and counted
(`skipped_context`), like a peer's sample the update's own length limits leave out.

Own samples always fit, except the empty, cut ones a model answers to a prompt that alone fills its
context (`hacfed.rollout.hf.response_budgets`); those are left out and counted too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from hacfed.trajectory import Trajectory, build_training_view


@dataclass(frozen=True)
class Readable:
    """The samples a learner trains on, and how many it could not read (own and peers')."""

    pool: tuple[Trajectory, ...]
    skipped_own: int
    skipped_peers: int


def readable_pool(pool: Sequence[Trajectory], learner: str, tokenizer: Any, context: int,
                  own: Mapping[str, Trajectory] | None = None) -> Readable:
    """The samples of `pool` whose prompt + response, in `learner`'s tokens, fit in `context`
    positions. Own samples are measured with their sampled token ids when `own` (trajectory id ->
    the local trajectory) still has them."""
    if isinstance(context, bool) or not isinstance(context, int) or context < 2:
        raise ValueError(f"context must be an int >= 2, got {context!r}")
    kept: list[Trajectory] = []
    skipped_own = skipped_peers = 0
    for t in pool:
        is_own = t.source_id == learner
        local = (own or {}).get(t.trajectory_id) if is_own else None
        measured = local if local is not None and local.response_text == t.response_text else t
        if fits(measured, learner, tokenizer, context):
            kept.append(t)
        elif is_own:
            skipped_own += 1
        else:
            skipped_peers += 1
    return Readable(tuple(kept), skipped_own, skipped_peers)


def fits(t: Trajectory, learner: str, tokenizer: Any, context: int) -> bool:
    """Whether `t`'s training view for `learner` (prompt, response and EOS) fits in `context`."""
    try:
        view = build_training_view(t, learner, tokenizer, context, context, overflow="error")
    except ValueError:  # longer than the context on its own, or an empty response that was cut
        return False
    return len(view.prompt_ids) + len(view.response_ids) <= context


def model_context(model: Any) -> int:
    """The model's context in positions (its config's `max_position_embeddings`)."""
    config = getattr(model, "config", None)
    limit = getattr(config, "max_position_embeddings", None)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 2:
        raise ValueError(
            f"model {type(model).__name__} does not state its context (config.max_position_embeddings is "
            f"{limit!r}): set max_prompt_len and max_response_len in the participant's config"
        )
    return limit
