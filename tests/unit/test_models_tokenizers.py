"""The zoo's three tokenizers: round-trips, chat templates, and that they really differ."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import pre_tokenizers
from transformers import AutoTokenizer

from hacfed.models.tokenizers import CHAR_ALPHABET, TOKENIZER_KINDS, build_tokenizer, byte_symbols
from hacfed.tasks.arithmetic import ArithmeticTask
from hacfed.trajectory import ChatMessage, messages_as_dicts, render_prompt_ids

PROMPT = [{"role": "user", "content": "12+34="}]
ASCII_TEXT = st.text(alphabet=st.sampled_from(CHAR_ALPHABET), max_size=60)


@pytest.fixture(scope="module")
def toks():
    return {kind: build_tokenizer(kind) for kind in TOKENIZER_KINDS}


def roundtrip(tok, text: str) -> str:
    return tok.decode(tok(text, add_special_tokens=False)["input_ids"])


@settings(max_examples=60, deadline=None)
@given(text=ASCII_TEXT)
def test_every_tokenizer_round_trips_printable_ascii(toks, text):
    for kind, tok in toks.items():
        assert roundtrip(tok, text) == text, kind


@settings(max_examples=40, deadline=None)
@given(text=st.text(max_size=40))
def test_byte_level_tokenizers_round_trip_any_unicode(toks, text):
    assert roundtrip(toks["byte"], text) == text
    assert roundtrip(toks["bpe"], text) == text


def test_byte_tokenizer_ids_are_utf8_byte_values(toks):
    text = "héllo 12+3=\n"
    assert toks["byte"](text, add_special_tokens=False)["input_ids"] == list(text.encode("utf-8"))
    assert set(byte_symbols()) == set(pre_tokenizers.ByteLevel.alphabet())


def test_char_tokenizer_maps_unknown_characters_to_unk(toks):
    tok = toks["char"]
    ids = tok("a€b", add_special_tokens=False)["input_ids"]
    assert ids == [tok.convert_tokens_to_ids("a"), tok.unk_token_id, tok.convert_tokens_to_ids("b")]
    assert len(tok) == len(CHAR_ALPHABET) + 7  # 97 characters + pad, bos, eos, unk, 3 role tokens


def test_special_tokens(toks):
    for kind, tok in toks.items():
        assert tok.eos_token_id is not None and tok.pad_token_id is not None, kind
        assert tok.pad_token_id != tok.eos_token_id, kind  # padding is never mistaken for a stop
    assert toks["char"].bos_token == "<s>"
    assert toks["bpe"].eos_token == "<|im_end|>"


def test_chat_templates_render_and_differ(toks):
    rendered = {
        kind: tok.apply_chat_template(PROMPT, tokenize=False, add_generation_prompt=True) for kind, tok in toks.items()
    }
    assert rendered["byte"] == "User: 12+34=\nAssistant: "
    assert rendered["char"] == "<s><|user|>\n12+34=</s>\n<|assistant|>\n"
    assert rendered["bpe"] == "<|im_start|>user\n12+34=<|im_end|>\n<|im_start|>assistant\n"
    # Without the generation prompt the assistant header is absent.
    plain = toks["bpe"].apply_chat_template(PROMPT, tokenize=False, add_generation_prompt=False)
    assert not plain.endswith("assistant\n")


def test_assistant_turns_end_with_eos(toks):
    convo = PROMPT + [{"role": "assistant", "content": "46"}]
    for kind, tok in toks.items():
        text = tok.apply_chat_template(convo, tokenize=False)
        assert f"46{tok.eos_token}" in text, kind


def test_template_special_tokens_are_single_tokens(toks):
    ids = render_prompt_ids(toks["char"], [ChatMessage("user", "1+2=")])
    char = toks["char"]
    assert ids[:2] == [char.bos_token_id, char.convert_tokens_to_ids("<|user|>")]
    bpe = toks["bpe"]
    ids = render_prompt_ids(bpe, [ChatMessage("user", "1+2=")])
    assert ids[0] == bpe.convert_tokens_to_ids("<|im_start|>")
    assert bpe.convert_tokens_to_ids("<|im_end|>") in ids


def test_same_text_gives_different_ids_across_tokenizers(toks):
    text = "You are a helpful assistant. The answer is 46."
    encoded = {kind: tok(text, add_special_tokens=False)["input_ids"] for kind, tok in toks.items()}
    for a, b in itertools.combinations(TOKENIZER_KINDS, 2):
        assert encoded[a] != encoded[b], (a, b)
    assert len(encoded["bpe"]) < len(encoded["byte"])  # merges learned from template text
    assert len(encoded["char"]) == len(text)


def test_bpe_is_deterministic_small_and_splits_digits(toks):
    again = build_tokenizer("bpe")
    assert again.backend_tokenizer.to_str() == toks["bpe"].backend_tokenizer.to_str()
    assert 256 < len(again) <= 400
    pieces = again.tokenize("12345+678=")
    assert pieces[:5] == list("12345")


def test_tokenizers_survive_save_and_reload(toks, tmp_path):
    messages = messages_as_dicts(ArithmeticTask().eval_problems()[0].messages)
    for kind, tok in toks.items():
        tok.save_pretrained(tmp_path / kind)
        loaded = AutoTokenizer.from_pretrained(tmp_path / kind)
        text = loaded.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert text == tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert loaded(text, add_special_tokens=False)["input_ids"] == tok(text, add_special_tokens=False)["input_ids"]
        assert (loaded.eos_token_id, loaded.pad_token_id) == (tok.eos_token_id, tok.pad_token_id)
        assert roundtrip(loaded, " a  b . , c ' s") == " a  b . , c ' s"


def test_unknown_kind_is_rejected():
    with pytest.raises(ValueError, match="unknown tokenizer kind 'wordpiece'"):
        build_tokenizer("wordpiece")
