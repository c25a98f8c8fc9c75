"""Trajectory.__post_init__'s one-expression fast path (`_plainly_valid`) decides exactly as the
field-by-field checks: it accepts only what they accept, and every refusal still comes from them
with the message that names the bad value."""

from __future__ import annotations

import math

import pytest

from hacfed.trajectory import ChatMessage, Trajectory, _plainly_valid

PROMPT = (ChatMessage("user", "what is 6 x 7?"),)
GOOD = dict(trajectory_id="t1", prompt_id="p1", source_id="lab-a", policy_version=3, prompt=PROMPT,
            response_text="\\boxed{42}", reward=1.0, source_logp_sum=-12.5, source_token_count=40,
            finish_reason="stop")


class Str(str):
    pass


BAD = [
    ("trajectory_id", ""), ("prompt_id", 7), ("source_id", None), ("policy_version", -1),
    ("policy_version", True), ("policy_version", 2.0), ("prompt", ()), ("prompt", list(PROMPT)),
    ("prompt", ("user",)), ("response_text", b"x"), ("reward", math.nan), ("reward", math.inf),
    ("reward", 1.5), ("reward", -0.1), ("reward", True), ("source_logp_sum", math.nan),
    ("source_logp_sum", -math.inf), ("source_logp_sum", 0.01), ("source_token_count", -1),
    ("source_token_count", 1.0), ("finish_reason", "eos"), ("finish_reason", None),
]


@pytest.mark.parametrize(("name", "value"), BAD)
def test_every_refusal_still_raised_naming_the_field(name: str, value: object) -> None:
    with pytest.raises(ValueError, match=name.split("_")[0] if name != "prompt" else "prompt"):
        Trajectory(**{**GOOD, name: value})


def test_zero_tokens_with_a_log_prob_refused() -> None:
    with pytest.raises(ValueError, match="source_token_count 0"):
        Trajectory(**{**GOOD, "source_token_count": 0, "source_logp_sum": -1.0})


@pytest.mark.parametrize(("name", "value"), [
    ("reward", 1), ("source_logp_sum", 0), ("source_logp_sum", 5e-5), ("finish_reason", Str("length")),
    ("trajectory_id", Str("t2")), ("source_token_count", 0),
])
def test_unusual_but_valid_values_still_accepted(name: str, value: object) -> None:
    fields = {**GOOD, name: value}
    if name == "source_token_count":
        fields["source_logp_sum"] = 0.0
    t = Trajectory(**fields)
    assert getattr(t, name) == value


def test_plain_trajectory_takes_the_fast_path() -> None:
    assert _plainly_valid(Trajectory(**GOOD))
    assert not _plainly_valid(Trajectory(**{**GOOD, "reward": 1}))  # decided by the full checks


def test_remembered_prompt_does_not_vouch_for_another_tuple() -> None:
    Trajectory(**GOOD)  # PROMPT is now the remembered one
    with pytest.raises(ValueError, match="prompt"):
        Trajectory(**{**GOOD, "prompt": (PROMPT[0], "not a message")})
    with pytest.raises(ValueError, match="prompt"):
        Trajectory(**{**GOOD, "prompt": ("user",)})
    assert Trajectory(**GOOD).prompt is PROMPT


def test_local_ids_still_checked() -> None:
    with pytest.raises(ValueError, match="response_token_ids has 2 ids"):
        Trajectory(**{**GOOD, "response_token_ids": (1, 2)})
    assert Trajectory(**{**GOOD, "source_token_count": 2, "response_token_ids": (1, 2)}).response_token_ids == (1, 2)
