"""Three genuinely different tokenizers for the built-in tiny agents, built offline.

HACPO's point is collaboration across *heterogeneous* agents: other agents' text is re-tokenized
with the learner's own tokenizer and chat template. So the zoo's tokenizers differ in vocabulary,
granularity and chat format, exactly like real labs' models do:

    kind  vocabulary                                chat format (generation prompt)
    byte  256 byte tokens + <|endoftext|>, <|pad|>   "User: 12+34=\\nAssistant: "  (GPT-2 style)
    char  97 printable-ASCII characters + specials   "<s><|user|>\\n12+34=</s>\\n<|assistant|>\\n"  (Zephyr/Llama)
    bpe   byte-level BPE trained here on task text   "<|im_start|>user\\n12+34=<|im_end|>\\n<|im_start|>assistant\\n"
                                                     (ChatML/Qwen2 style)

Every tokenizer is a `transformers.PreTrainedTokenizerFast` with pad and eos (and bos for the
char/Llama one), `clean_up_tokenization_spaces=False` (so decode(encode(text)) == text for text in
its alphabet) and no post-processor: the chat template writes every special token itself, so
`tokenizer(text, add_special_tokens=True)` never doubles a BOS.

    tok = build_tokenizer("bpe")
    tok.apply_chat_template([{"role": "user", "content": "12+34="}], tokenize=False, add_generation_prompt=True)
"""

from __future__ import annotations

import random
from typing import Literal, get_args

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

TokenizerKind = Literal["byte", "char", "bpe"]
TOKENIZER_KINDS: tuple[str, ...] = get_args(TokenizerKind)

# Printable ASCII (space..tilde) plus newline and tab: everything the tasks and templates write.
CHAR_ALPHABET: tuple[str, ...] = tuple(chr(c) for c in range(32, 127)) + ("\n", "\t")
BPE_VOCAB_SIZE = 320  # 256 byte symbols + 3 specials + ~60 merges learned from the task text

# Chat templates (jinja). Each ends an assistant turn with the tokenizer's EOS, so a policy learns
# to stop by emitting EOS right after its answer.
_BYTE_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ m['content'] }}\n\n"
    "{% elif m['role'] == 'user' %}User: {{ m['content'] }}\n"
    "{% else %}Assistant: {{ m['content'] }}{{ eos_token }}\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}Assistant: {% endif %}"
)
_CHAR_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
_CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tokenizer(kind: str) -> PreTrainedTokenizerFast:
    """A fresh tokenizer of `kind` ("byte", "char" or "bpe"); deterministic, no network."""
    if kind == "byte":
        return _byte_tokenizer()
    if kind == "char":
        return _char_tokenizer()
    if kind == "bpe":
        return _bpe_tokenizer()
    raise ValueError(f"unknown tokenizer kind {kind!r}; expected one of {TOKENIZER_KINDS}")


def _register_specials(tok: Tokenizer, specials: list[str]) -> None:
    # Registered as added special tokens so they match as one token inside rendered chat text and
    # are dropped by decode(skip_special_tokens=True).
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])


def _wrap(tok: Tokenizer, *, chat_template: str, **special: str) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        chat_template=chat_template,
        clean_up_tokenization_spaces=False,
        model_max_length=1024,
        **special,
    )


def _byte_tokenizer() -> PreTrainedTokenizerFast:
    """GPT-2 style: one token per UTF-8 byte (no merges), so any text round-trips."""
    specials = ["<|endoftext|>", "<|pad|>"]
    vocab = {symbol: byte for byte, symbol in enumerate(byte_symbols())}  # token id == byte value
    vocab.update({s: 256 + i for i, s in enumerate(specials)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    _register_specials(tok, specials)
    return _wrap(
        tok, chat_template=_BYTE_TEMPLATE,
        bos_token="<|endoftext|>", eos_token="<|endoftext|>", pad_token="<|pad|>",
    )


def _char_tokenizer() -> PreTrainedTokenizerFast:
    """Llama/Zephyr style: one token per printable-ASCII character, `<unk>` for anything else."""
    specials = ["<pad>", "<s>", "</s>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>"]
    vocab = {s: i for i, s in enumerate(specials + list(CHAR_ALPHABET))}
    # A BPE model with no merges is a character model; fuse_unk=False keeps one <unk> per character.
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", fuse_unk=False))
    tok.decoder = decoders.Fuse()  # concatenate characters, no separator
    _register_specials(tok, specials)
    return _wrap(
        tok, chat_template=_CHAR_TEMPLATE,
        bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
    )


def byte_symbols() -> list[str]:
    """The printable stand-in character of each byte value 0..255, as the ByteLevel pre-tokenizer
    writes them: printable Latin-1 bytes stand for themselves, the other 68 bytes map in order to
    the code points from 256 up."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    symbols: list[str] = []
    next_free = 256
    for byte in range(256):
        if byte in printable:
            symbols.append(chr(byte))
        else:
            symbols.append(chr(next_free))
            next_free += 1
    return symbols


def _bpe_tokenizer() -> PreTrainedTokenizerFast:
    """Qwen2 style: byte-level BPE with single-digit pre-splitting, merges learned from task text."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    # Digits stay single tokens (as in Qwen2), so numbers are spelled the same way in every context.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte is representable
        show_progress=False,
    )
    tok.train_from_iterator(bpe_training_corpus(), trainer=trainer)
    _register_specials(tok, specials)
    return _wrap(
        tok, chat_template=_CHATML_TEMPLATE,
        eos_token="<|im_end|>", pad_token="<|endoftext|>",
    )


_TEMPLATE_PHRASES = (
    "system", "user", "assistant", "You are a helpful assistant.",
    "Solve the problem.", "What is the sum?", "What is the difference?",
    "The answer is", "Answer:", "Question:", "Let's think step by step.",
    "Put the final answer in \\boxed{}.", "plus", "minus", "equals", "total", "left",
)


def bpe_training_corpus(num_lines: int = 4000, seed: int = 0) -> list[str]:
    """Deterministic text the BPE is trained on: arithmetic lines and chat/template phrases."""
    rng = random.Random(f"hacfed-bpe-corpus:{seed}")
    lines: list[str] = []
    for i in range(num_lines):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        op = "+" if i % 2 == 0 else "-"
        a, b = (a, b) if op == "+" or a >= b else (b, a)
        value = a + b if op == "+" else a - b
        phrase = _TEMPLATE_PHRASES[i % len(_TEMPLATE_PHRASES)]
        lines.append(f"user\n{a}{op}{b}=\nassistant\n{value}\n{phrase} {a} {op} {b} = {value}")
    return lines
