"""A participant's training side: its trainable policy, reference policy and optimizer, and one
round's training on the pool.

Runs in a lab's hacfed-client process (and in `hacfed sim`), called by `Participant`
(`hacfed.clients.participant`). The HACPO update itself (views, advantages, minibatches, losses) is
`hacfed.clients.update`; this module decides what it trains (the full model, or a LoRA adapter whose
disabled state is the reference policy) and hands it the pool with the participant's own samples
carrying their exact sampled token ids.
"""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

import torch

from hacfed.clients.shards import Shards
from hacfed.clients.update import Reference, default_minibatch, hacpo_update
from hacfed.clients.update_parallel import DataParallel
from hacfed.messages import RoundUpdate
from hacfed.trajectory import Trajectory


class TrainingConfig(Protocol):
    """The settings this module reads, read-only and already checked (`hacfed.clients.participant_config`;
    `Participant` resolves unset max_prompt_len / max_response_len to the model's context)."""

    @property
    def finetune(self) -> str: ...
    @property
    def lora_rank(self) -> int: ...
    @property
    def lora_alpha(self) -> int: ...
    @property
    def learning_rate(self) -> float: ...
    @property
    def minibatch_size(self) -> int | None: ...
    @property
    def max_grad_norm(self) -> float: ...
    @property
    def microbatch_tokens(self) -> int | None: ...
    @property
    def max_prompt_len(self) -> int | None: ...
    @property
    def max_response_len(self) -> int | None: ...


@contextlib.contextmanager
def frozen_copy_reference(ref_model: Any) -> Iterator[Any]:
    """The reference policy of a full fine-tune: a frozen copy of the initial model."""
    yield ref_model


@contextlib.contextmanager
def adapter_disabled_reference(peft_model: Any) -> Iterator[Any]:
    """The reference policy of a LoRA fine-tune: the policy itself with its adapter disabled."""
    with peft_model.disable_adapter():
        yield peft_model


def prepare_training(model: Any, cfg: TrainingConfig) -> tuple[Any, Reference, torch.optim.Optimizer]:
    """(policy, reference, optimizer): the model to train (wrapped with a LoRA adapter for
    `finetune="lora"`), the reference policy for the KL term (with LoRA: the same model with the
    adapter disabled; otherwise a frozen copy), and AdamW over the trainable parameters."""
    if cfg.finetune == "lora":
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=0.0, target_modules="all-linear")
        policy = get_peft_model(model, lora)
        reference: Reference = functools.partial(adapter_disabled_reference, policy)
    else:
        policy = model
        ref = copy.deepcopy(model).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        reference = functools.partial(frozen_copy_reference, ref)
    policy.eval()
    params = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=0.0)
    return policy, reference, optimizer


def train_on_pool(
    policy: Any, tokenizer: Any, optimizer: torch.optim.Optimizer, reference: Reference, update: RoundUpdate,
    *, learner: str, own: Mapping[str, Trajectory], capabilities: Mapping[str, float], cfg: TrainingConfig,
    shards: Shards | None = None, temperature: float = 1.0, trust: Mapping[str, float] | None = None,
    guided: Sequence[Trajectory] = (),
) -> dict[str, float]:
    """One HACPO update of `policy` on the update's pool, with `learner` as k; returns its metrics.
    With `shards`, this rank's part of a data-parallel update (`hacfed.clients.distributed`).
    `temperature`: the pool's sampling temperature; `trust`: the lab's weight of each partner
    (`hacfed.clients.trust`); `guided`: the lab's guided continuations (`hacfed.clients.guided`),
    own samples trained after the pool's, which leave the minibatch size the pool's."""
    # Own samples keep the exact sampled ids from our rollout (the pool carries text only).
    # The pool's reward is the coordinator's verified one; only the ids come from the local cache.
    pool = [with_local_ids(t, own, learner) for t in update.pool]
    agents = update.participants or tuple(sorted({t.source_id for t in pool}))
    minibatch = cfg.minibatch_size or default_minibatch(pool)
    return hacpo_update(
        policy, tokenizer, optimizer, reference, [*pool, *guided], learner, agents, capabilities, update.hacpo,
        minibatch_size=minibatch, max_grad_norm=cfg.max_grad_norm,
        max_prompt_len=cfg.max_prompt_len, max_response_len=cfg.max_response_len,
        split=DataParallel(shards, cfg.microbatch_tokens) if shards is not None else None,
        microbatch_tokens=cfg.microbatch_tokens, temperature=temperature, trust=trust,
    )


def with_local_ids(t: Trajectory, own: Mapping[str, Trajectory], learner: str) -> Trajectory:
    """`t` with the token ids of the learner's own sample of the same id, when it is one (and the
    text still matches); any other trajectory unchanged."""
    local = own.get(t.trajectory_id) if t.source_id == learner else None
    if local is None or local.response_text != t.response_text or local.source_token_count != t.source_token_count:
        return t
    return Trajectory(**{**t.__dict__, "response_token_ids": local.response_token_ids})
