"""Trajectory validation and learner views with two genuinely different tokenizers built offline."""

from __future__ import annotations

import math

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from hacfed.trajectory import ChatMessage, Trajectory, build_training_view

PROMPT = (ChatMessage("user", "12+34="),)


def _char_tokenizer() -> PreTrainedTokenizerFast:
    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{c: i + 3 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    fast.chat_template = ("{% for m in messages %}[{{ m.role }}]{{ m.content }}\n{% endfor %}"
                          "{% if add_generation_prompt %}[assistant]{% endif %}")
    return fast


def _byte_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(vocab=_byte_vocab(), merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|end|>", pad_token="<|pad|>")
    fast.add_special_tokens({"eos_token": "<|end|>", "pad_token": "<|pad|>"})
    fast.chat_template = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
                          "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    return fast


def _byte_vocab() -> dict[str, int]:
    return {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}


@pytest.fixture(scope="module")
def char_tok():
    return _char_tokenizer()


@pytest.fixture(scope="module")
def byte_tok():
    return _byte_tokenizer()


def traj(**kw) -> Trajectory:
    base = dict(
        trajectory_id="t1", prompt_id="add2:12+34", source_id="a", policy_version=0, prompt=PROMPT,
        response_text="46", reward=1.0, source_logp_sum=-0.5, source_token_count=2, finish_reason="stop",
    )
    base.update(kw)
    return Trajectory(**base)


def test_tokenizers_really_differ(char_tok, byte_tok):
    text = "héllo 46"
    a = char_tok(text, add_special_tokens=False)["input_ids"]
    b = byte_tok(text, add_special_tokens=False)["input_ids"]
    assert len(a) == 8 and len(b) == 9  # 'é' is one (unknown) char token but two bytes
    assert byte_tok.decode(b) == text


def test_cross_view_is_retokenized_with_learners_template(char_tok, byte_tok):
    t = traj(source_id="b", response_text="46")
    view = build_training_view(t, "a", char_tok, max_prompt_len=64, max_response_len=8)
    assert char_tok.decode(list(view.prompt_ids)) == "[user]12+34=\n[assistant]"
    assert view.response_ids == (
        char_tok.convert_tokens_to_ids("4"), char_tok.convert_tokens_to_ids("6"), char_tok.eos_token_id
    )
    assert view.ratio_token_count == 2 and not view.is_self
    assert view.source_mean_logp == pytest.approx(-0.25)
    byte_view = build_training_view(t, "c", byte_tok, max_prompt_len=64, max_response_len=8)
    assert byte_tok.decode(list(byte_view.prompt_ids)) == "<|user|>12+34=<|assistant|>"
    assert byte_view.response_ids[-1] == byte_tok.eos_token_id
    assert byte_view.prompt_ids != view.prompt_ids


def test_own_view_reuses_sampled_ids(char_tok):
    # Own samples keep their exact ids even if re-tokenizing the text would differ.
    t = traj(source_id="a", response_text="46", response_token_ids=(40, 41), source_token_count=2)
    view = build_training_view(t, "a", char_tok, 64, 8)
    assert view.response_ids == (40, 41, char_tok.eos_token_id) and view.is_self
    # Another learner ignores local ids and re-tokenizes the text
    other = build_training_view(t, "b", char_tok, 64, 8)
    assert other.response_ids[:2] != (40, 41)


def test_eos_only_response_becomes_learners_eos(char_tok, byte_tok):
    t = traj(response_text="", source_logp_sum=0.0, source_token_count=0, source_id="b")
    for tok in (char_tok, byte_tok):
        view = build_training_view(t, "a", tok, 64, 8)
        assert view.response_ids == (tok.eos_token_id,)
        assert view.ratio_token_count == 1 and view.source_mean_logp is None


def test_empty_retokenized_response_is_an_error(byte_tok):
    # A zero-width-only text that the learner's tokenizer drops entirely cannot be trained on.
    class Dropping:
        eos_token_id = 1

        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            return "x"

        def __call__(self, text, add_special_tokens):
            return {"input_ids": [5] if text == "x" else []}

    with pytest.raises(ValueError, match="re-tokenizes to nothing"):
        build_training_view(traj(source_id="b", response_text="\u200b"), "a", Dropping(), 64, 8)


def test_overflow_truncate_and_error(char_tok):
    t = traj(source_id="b", response_text="123456789")
    view = build_training_view(t, "a", char_tok, 64, 4)
    assert len(view.response_ids) == 4 and view.truncated and view.ratio_token_count == 4
    with pytest.raises(ValueError, match="max_response_len 4"):
        build_training_view(t, "a", char_tok, 64, 4, overflow="error")
    short = build_training_view(t, "a", char_tok, 5, 64)
    assert len(short.prompt_ids) == 5 and char_tok.decode(list(short.prompt_ids)).endswith("[assistant]"[-5:])
    with pytest.raises(ValueError, match="max_prompt_len 5"):
        build_training_view(t, "a", char_tok, 5, 64, overflow="error")
    with pytest.raises(ValueError, match="overflow"):
        build_training_view(t, "a", char_tok, 5, 64, overflow="drop")


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("reward", 1.5, "reward.*1.5"),
        ("reward", math.nan, "reward.*nan"),
        ("source_logp_sum", 0.5, "source_logp_sum.*0.5"),
        ("source_logp_sum", -math.inf, "source_logp_sum.*inf"),
        ("source_token_count", -1, "source_token_count.*-1"),
        ("finish_reason", "eos", "finish_reason.*'eos'"),
        ("prompt_id", "", "prompt_id"),
        ("policy_version", -2, "policy_version.*-2"),
        ("prompt", (), "prompt"),
    ],
)
def test_trajectory_validation(field, value, match):
    with pytest.raises(ValueError, match=match):
        traj(**{field: value})


def test_trajectory_local_ids_must_match_count_and_are_dropped_for_wire():
    with pytest.raises(ValueError, match="3 ids but source_token_count is 2"):
        traj(response_token_ids=(1, 2, 3))
    t = traj(response_token_ids=(1, 2))
    assert t.without_local_ids().response_token_ids is None
    assert t.without_local_ids() == t  # local ids do not take part in equality
