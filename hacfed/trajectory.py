"""Tokenizer-neutral trajectories and learner-side training views (docs/hacpo.md §1, docs/design.md).

A `Trajectory` is what crosses the wire: text, reward and the source policy's log-prob summary
(sum and token count of its own response tokens, EOS excluded). A `TrainingView` is the same sample
in one learner's token space. `build_training_view` converts one into the other. Torch-free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal, Sequence

FinishReason = Literal["stop", "length"]
FINISH_REASONS = ("stop", "length")
# A log-prob sum may be a hair above 0 from float rounding; anything more is a forgery (security T3).
LOGP_EPS = 1e-4


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str

    def __post_init__(self) -> None:
        if self.role not in ("system", "user", "assistant"):
            raise ValueError(f"ChatMessage.role must be system/user/assistant, got {self.role!r}")
        if not isinstance(self.content, str):
            raise ValueError(f"ChatMessage.content must be a str, got {type(self.content).__name__}")

    def as_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


def messages_as_dicts(messages: Sequence[ChatMessage]) -> list[dict[str, str]]:
    return [m.as_dict() for m in messages]


@dataclass(frozen=True)
class Trajectory:
    """One verified-or-claimed rollout, tokenizer-neutral.

    `response_token_ids` is local-only: set by the participant that produced the sample so its own
    view reuses the exact sampled ids; it is never serialized onto the wire.
    """

    trajectory_id: str
    prompt_id: str
    source_id: str
    policy_version: int
    prompt: tuple[ChatMessage, ...]
    response_text: str
    reward: float
    source_logp_sum: float
    source_token_count: int
    finish_reason: FinishReason
    response_token_ids: tuple[int, ...] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if _plainly_valid(self):
            return
        self._check_fields()

    def _check_fields(self) -> None:
        """Every check, in order, each refusal naming the bad value (`__post_init__`'s slow path)."""
        for name in ("trajectory_id", "prompt_id", "source_id"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"Trajectory.{name} must be a non-empty string, got {value!r}")
        if isinstance(self.policy_version, bool) or not isinstance(self.policy_version, int) or self.policy_version < 0:
            raise ValueError(f"Trajectory.policy_version must be an int >= 0, got {self.policy_version!r}")
        prompt = self.prompt
        if not isinstance(prompt, tuple) or not prompt or not all(isinstance(m, ChatMessage) for m in prompt):
            raise ValueError(f"Trajectory.prompt must be a non-empty tuple of ChatMessage, got {self.prompt!r}")
        if not isinstance(self.response_text, str):
            raise ValueError(f"Trajectory.response_text must be a str, got {type(self.response_text).__name__}")
        reward = self.reward
        if (
            isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward)
            or not 0.0 <= reward <= 1.0
        ):
            raise ValueError(f"Trajectory.reward must be a finite number in [0, 1], got {reward!r}")
        lp = self.source_logp_sum
        if isinstance(lp, bool) or not isinstance(lp, (int, float)) or not math.isfinite(lp) or lp > LOGP_EPS:
            raise ValueError(f"Trajectory.source_logp_sum must be finite and <= 0, got {lp!r}")
        n = self.source_token_count
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"Trajectory.source_token_count must be an int >= 0, got {n!r}")
        if n == 0 and lp != 0.0:
            raise ValueError(f"Trajectory with source_token_count 0 must have source_logp_sum 0, got {lp!r}")
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"Trajectory.finish_reason must be one of {FINISH_REASONS}, got {self.finish_reason!r}")
        if self.response_token_ids is not None:
            ids = self.response_token_ids
            if not isinstance(ids, tuple) or not all(isinstance(i, int) and i >= 0 for i in ids):
                raise ValueError("Trajectory.response_token_ids must be a tuple of non-negative ints")
            if len(ids) != n:
                raise ValueError(
                    f"Trajectory.response_token_ids has {len(ids)} ids but source_token_count is {n}"
                )

    @property
    def source_mean_logp(self) -> float | None:
        """Per-token mean log-prob of the source policy; None for an EOS-only response (0 tokens)."""
        if self.source_token_count == 0:
            return None
        return self.source_logp_sum / self.source_token_count

    def without_local_ids(self) -> "Trajectory":
        if self.response_token_ids is None:
            return self
        return Trajectory(**{**self.__dict__, "response_token_ids": None})


_INF = math.inf
_last_prompt: list[object] = [None]  # the prompt tuple that last passed `_plainly_valid`'s prompt check


def _plainly_valid(t: Trajectory) -> bool:
    """True when `t` passes every check of `Trajectory._check_fields`, decided for the common
    case of exact built-in types (str, int, float, a tuple of ChatMessage) in one expression:
    the coordinator builds ~1,000 trajectories per lab per round (bench/coordinator_scale.py) and
    the field-by-field checks were a tenth of decoding one. False means "not decided here": the
    full checks then run and raise (or accept an unusual but valid value such as an int reward).

    The prompt check is remembered for the one prompt tuple that last passed it (a group's G
    samples share their prompt object): a tuple cannot change which objects it holds, and the
    reference kept here keeps it alive, so `is` can never match a different tuple."""
    v, reward, lp, n, ids = t.policy_version, t.reward, t.source_logp_sum, t.source_token_count, t.response_token_ids
    if not (
        type(t.trajectory_id) is str and t.trajectory_id and type(t.prompt_id) is str and t.prompt_id
        and type(t.source_id) is str and t.source_id and type(v) is int and v >= 0
        and type(t.response_text) is str and type(reward) is float and 0.0 <= reward <= 1.0
        and type(lp) is float and -_INF < lp <= LOGP_EPS and type(n) is int and n >= 0
        and (n != 0 or lp == 0.0) and (t.finish_reason == "stop" or t.finish_reason == "length")
        and type(t.finish_reason) is str and ids is None
    ):
        return False
    prompt = t.prompt
    if prompt is _last_prompt[0]:
        return True
    if type(prompt) is not tuple or not prompt or not all(type(m) is ChatMessage for m in prompt):
        return False
    _last_prompt[0] = prompt
    return True


@dataclass(frozen=True)
class TrainingView:
    """A trajectory in one learner's token space.

    response_ids: the learner's tokens of the response, followed by the learner's EOS when the
      response stopped (finish_reason "stop"), so the update sees the same sequence the learner
      would have produced.
    ratio_token_count: how many leading response tokens form the sequence log-prob mean of the
      GSPO ratio. This excludes EOS to match the source's summary; for an EOS-only response it is 1
      (the EOS itself) and `source_mean_logp` is None (the learner's own old log-prob is used).
    """

    trajectory_id: str
    prompt_id: str
    source_id: str
    learner_id: str
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    ratio_token_count: int
    reward: float
    source_mean_logp: float | None
    truncated: bool
    source_logp_sum: float = 0.0  # the source's summary: sum over its tokens (EOS excluded)
    text_bytes: int = 0  # UTF-8 bytes of the response text: the tokenizer-neutral length

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError(f"TrainingView {self.trajectory_id!r}: empty prompt")
        if not self.response_ids:
            raise ValueError(f"TrainingView {self.trajectory_id!r}: empty response")
        if not 1 <= self.ratio_token_count <= len(self.response_ids):
            raise ValueError(
                f"TrainingView {self.trajectory_id!r}: ratio_token_count {self.ratio_token_count} "
                f"outside [1, {len(self.response_ids)}]"
            )

    @property
    def is_self(self) -> bool:
        return self.source_id == self.learner_id


def render_prompt_ids(tokenizer: Any, prompt: Sequence[ChatMessage]) -> list[int]:
    """The learner's chat template applied to the prompt, ending with the generation prompt."""
    text = tokenizer.apply_chat_template(messages_as_dicts(prompt), tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def build_training_view(
    trajectory: Trajectory,
    learner_id: str,
    tokenizer: Any,
    max_prompt_len: int,
    max_response_len: int,
    overflow: Literal["truncate", "error"] = "truncate",
) -> TrainingView:
    """Express `trajectory` in `learner_id`'s token space.

    Own samples reuse their sampled token ids (when present); other agents' text is re-tokenized
    with the learner's tokenizer and chat template. Prompts are truncated from the left (keeping the
    generation prompt), responses from the right; a truncated response loses its EOS.
    """
    if overflow not in ("truncate", "error"):
        raise ValueError(f"overflow must be 'truncate' or 'error', got {overflow!r}")
    if max_prompt_len < 1 or max_response_len < 1:
        raise ValueError(f"max_prompt_len/max_response_len must be >= 1, got {max_prompt_len}/{max_response_len}")
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError(f"learner {learner_id!r}: tokenizer has no eos_token_id")
    prompt_ids = render_prompt_ids(tokenizer, trajectory.prompt)
    is_self = trajectory.source_id == learner_id
    if is_self and trajectory.response_token_ids is not None:
        content = list(trajectory.response_token_ids)
    else:
        content = list(tokenizer(trajectory.response_text, add_special_tokens=False)["input_ids"])
        if not content and trajectory.response_text:
            raise ValueError(
                f"trajectory {trajectory.trajectory_id!r}: response {trajectory.response_text[:40]!r} "
                f"re-tokenizes to nothing for learner {learner_id!r}"
            )
    truncated = False
    if len(prompt_ids) > max_prompt_len:
        if overflow == "error":
            raise ValueError(
                f"trajectory {trajectory.trajectory_id!r}: prompt has {len(prompt_ids)} tokens "
                f"> max_prompt_len {max_prompt_len}"
            )
        prompt_ids = prompt_ids[-max_prompt_len:]
        truncated = True
    stopped = trajectory.finish_reason == "stop"
    if not content:
        if not stopped:
            raise ValueError(f"trajectory {trajectory.trajectory_id!r}: empty response that did not stop")
        # EOS-only response: the learner's EOS is the whole response and carries the ratio.
        return TrainingView(
            trajectory.trajectory_id, trajectory.prompt_id, trajectory.source_id, learner_id,
            tuple(prompt_ids), (eos,), 1, float(trajectory.reward), None, truncated, 0.0, 0,
        )
    response = content + ([eos] if stopped else [])
    if len(response) > max_response_len:
        if overflow == "error":
            raise ValueError(
                f"trajectory {trajectory.trajectory_id!r}: response has {len(response)} tokens "
                f"> max_response_len {max_response_len}"
            )
        response = response[:max_response_len]
        truncated = True
    ratio_count = min(len(content), len(response))
    return TrainingView(
        trajectory.trajectory_id, trajectory.prompt_id, trajectory.source_id, learner_id,
        tuple(prompt_ids), tuple(response), ratio_count, float(trajectory.reward),
        trajectory.source_mean_logp, truncated, float(trajectory.source_logp_sum),
        len(trajectory.response_text.encode("utf-8")),
    )
