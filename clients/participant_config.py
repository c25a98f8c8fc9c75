"""One lab's training choices (`ParticipantConfig`), each declared and checked here, once.

    cfg = ParticipantConfig("lab-a", "tiny-llama", learning_rate=1e-4, nproc=2)

Read by `hacfed.clients.participant.Participant` and, through it, by `training` and `update` (which
trust these values). hacfed-client builds it from the flat `[participant]` table and its flags
(`hacfed.clients.config`); `hacfed sim` from its options. Everything that must agree across labs
comes from the coordinator's plans, not from here. Torch-free, so a bad value is refused in one
line (naming the field and the value) before torch or a model loads.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from hacfed.clients.textfilter import DEFAULT_DENY_PATTERNS

MAX_NPROC = 64


@dataclass(frozen=True)
class ParticipantConfig:
    """Local choices of one lab; everything that must agree comes from the coordinator's plan."""

    participant_id: str
    model: str  # what `hacfed.models.loading.load_model` loads (`Participant.from_spec`)
    # "auto": LoRA above a size threshold, with activation checkpointing and bf16 where they pay
    # (hacfed.models.memory.memory_plan); the participant resolves it to "full" or "lora".
    finetune: Literal["full", "lora", "auto"] = "auto"
    lora_rank: int = 8
    lora_alpha: int = 16
    learning_rate: float = 5e-5  # tiny full-FT models; the paper's 1e-6 is for 1.7B-8B models
    minibatch_size: int | None = None  # None: prompts × G / 2 of the pool (the paper's 2 updates per source)
    max_grad_norm: float = 1.0
    # The most padded tokens (rows x (longest prompt + longest response)) one training forward holds:
    # a larger minibatch runs as microbatches with gradient accumulation, the same step up to float
    # rounding (hacfed.clients.update). hacfed.models.memory's SmolLM2-135M measurement (6 GSM8K rows,
    # 1,446 padded tokens in one pass, 832 in the largest microbatch of a 1,024 budget: peak 5.0 GB ->
    # 0.72x) is ~2.3 MB per padded token, so 4,096 bounds its step's activations near 9 GB beside its
    # 2.7 GB of training state (a 16 GB machine; lower it on a smaller one). SmolLM2's add2-words and
    # gsm8k minibatches (up to ~1,700 tokens) and the tiny presets' default ones (64 rows of at most 68
    # tokens) stay in one pass, but for tiny-gpt2 on chain (up to 4,352 tokens: two). None: never split.
    # A Participant lowers it to what keeps one microbatch's activations within 512 MiB
    # (hacfed.models.memory.microbatch_token_cap): 187 tokens for SmolLM2-135M.
    microbatch_tokens: int | None = 4096
    # Longest prompt / response (in this model's tokens) the update takes. None: the model's context
    # for each, a sample being read when prompt + response fit in it (hacfed.clients.context).
    max_prompt_len: int | None = None
    max_response_len: int | None = None
    eval_problems: int = 200
    eval_split: Literal["test", "validation"] = "test"  # "validation" when choosing settings
    eval_sampled: bool = False  # also sampled pass@1 (one temperature-1 sample per problem)
    rollout_batch_size: int = 256
    device: str = "cpu"
    seed: int = 0
    checkpoint_dir: str | None = None  # None: no checkpoints (hacfed-client: STATE/checkpoints)
    keep_checkpoints: int = 3  # how many rounds back a purge can roll this lab back (hacfed-client replay)
    rollout_backend: Literal["hf", "vllm"] = "hf"
    nproc: int = 1  # data-parallel processes training this model (hacfed.clients.distributed)
    # Text checks (hacfed.clients.textfilter): peers' samples before they train the learner (the task's
    # format and the deny-list), the lab's own before they are sent (the deny-list); each a regular
    # expression or a literal string (a known canary), matched anywhere in a response.
    inbound_filter: bool = True
    outbound_filter: bool = True
    deny_patterns: tuple[str, ...] = DEFAULT_DENY_PATTERNS
    deny_strings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("participant_id", "model"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name).strip():
                _bad(name, getattr(self, name), "a non-empty string")
        if not isinstance(self.device, str) or not self.device:
            _bad("device", self.device, "a torch device such as cpu or cuda:0")
        _choice(self, "finetune", ("full", "lora", "auto"))
        _choice(self, "rollout_backend", ("hf", "vllm"))
        _choice(self, "eval_split", ("test", "validation"))
        for name in ("learning_rate", "max_grad_norm"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    math.isfinite(value) and value > 0):
                _bad(name, value, "a number > 0")
        for name in ("lora_rank", "lora_alpha", "eval_problems", "rollout_batch_size"):
            _integer(self, name, 1)
        for name in ("minibatch_size", "microbatch_tokens", "max_prompt_len", "max_response_len"):
            if getattr(self, name) is not None:
                _integer(self, name, 1, " (or unset)")
        _integer(self, "seed", 0)
        _integer(self, "keep_checkpoints", 2)
        for name in ("eval_sampled", "inbound_filter", "outbound_filter"):
            if not isinstance(getattr(self, name), bool):
                _bad(name, getattr(self, name), "true or false")
        _deny_list(self)
        if self.checkpoint_dir is not None:
            if not isinstance(self.checkpoint_dir, (str, Path)) or not str(self.checkpoint_dir):
                _bad("checkpoint_dir", self.checkpoint_dir, "a directory path (or unset: no checkpoints)")
            object.__setattr__(self, "checkpoint_dir", str(self.checkpoint_dir))
        if isinstance(self.nproc, bool) or not isinstance(self.nproc, int) or not 1 <= self.nproc <= MAX_NPROC:
            _bad("nproc", self.nproc, f"an integer in 1..{MAX_NPROC}")
        if self.nproc > 1 and self.rollout_backend != "hf":
            _bad("nproc", self.nproc, f"1 with rollout_backend {self.rollout_backend!r} (a vLLM engine is one process)")


def _bad(name: str, value: object, requirement: str) -> None:
    raise ValueError(f"ParticipantConfig.{name} must be {requirement}, got {value!r}")


def _deny_list(cfg: ParticipantConfig) -> None:
    """deny_patterns: regular expressions that compile and cannot match an empty response; deny_strings:
    non-empty strings. Lists (from TOML) become tuples."""
    for name in ("deny_patterns", "deny_strings"):
        value = getattr(cfg, name)
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            _bad(name, value, "a list of strings")
        for item in value:
            if not isinstance(item, str) or not item:
                _bad(name, item, "a list of non-empty strings")
        object.__setattr__(cfg, name, tuple(value))
    for pattern in cfg.deny_patterns:
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            _bad("deny_patterns", pattern, f"a list of regular expressions ({exc})")
        if compiled.search("") is not None:
            _bad("deny_patterns", pattern, "a list of regular expressions that cannot match an empty response")


def _choice(cfg: ParticipantConfig, name: str, choices: tuple[str, ...]) -> None:
    if getattr(cfg, name) not in choices:
        _bad(name, getattr(cfg, name), f"one of {list(choices)}")


def _integer(cfg: ParticipantConfig, name: str, least: int, note: str = "") -> None:
    value = getattr(cfg, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        _bad(name, value, f"an integer >= {least}{note}")
