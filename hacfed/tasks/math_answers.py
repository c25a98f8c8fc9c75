"""Where a math answer is in a model's text, and whether two plain decimals are the same number.

Pure functions, no I/O, used in process by `hacfed.tasks.math_verifier` (steps 2-4 of its pipeline)
and by the math tasks: the content of the last `\\boxed{...}` (brace matching, iterative, escaped
braces skipped) and/or the last plain number; the nesting depth that caps what math-verify may parse;
and the exact `Decimal` reading of a plain decimal (optional sign, optional 1,000-style grouping) or
of a dollar amount in ASCII digits, for the numeric fast path.
"""

from __future__ import annotations

import re
from decimal import Decimal
from functools import lru_cache
from typing import Literal

AnswerMode = Literal["boxed", "last_number", "boxed_or_last_number"]
ANSWER_MODES = ("boxed", "last_number", "boxed_or_last_number")

DOLLAR = "\\$"  # LaTeX's escaped dollar sign, as in \boxed{\$72}
_PLAIN_NUMBER = re.compile(r"[+-]?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)")
_NUMBER_IN_TEXT = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_BOXED = "\\boxed"


def extract_boxed(text: str) -> str | None:
    """Content of the last complete `\\boxed{...}`, or None.

    The last occurrence wins (final answers come last); if it is unclosed (a truncated generation)
    there is no answer rather than an earlier, intermediate one. `\\boxed 5` (no braces) gives "5"."""
    start = text.rfind(_BOXED)
    while start != -1 and text[start + len(_BOXED): start + len(_BOXED) + 1].isalpha():
        start = text.rfind(_BOXED, 0, start)  # `\boxedfoo` is another macro
    if start == -1:
        return None
    i = start + len(_BOXED)
    while i < len(text) and text[i] == " ":
        i += 1
    if i >= len(text):
        return None
    if text[i] != "{":
        token = re.match(r"[^\s$]+", text[i:])
        return token.group(0) if token else None
    depth, j = 1, i + 1
    while j < len(text):
        c = text[j]
        if c == "\\":
            j += 2  # `\{`, `\}` and `\\` are literal, not grouping
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
        j += 1
    return None


def extract_last_number(text: str) -> str | None:
    """The last number in `text` (optional minus, 1,000-style grouping, decimals), or None."""
    last = None
    for last in _NUMBER_IN_TEXT.finditer(text):
        pass
    return last.group(0) if last else None


def extract_answer(text: str, mode: AnswerMode = "boxed") -> str | None:
    """The final answer by `mode`; None when the text holds no answer of that kind."""
    if mode in ("boxed", "boxed_or_last_number"):
        boxed = extract_boxed(text)
        if boxed is not None or mode == "boxed":
            return boxed
    return extract_last_number(text)


def nesting_depth(text: str) -> int:
    """Deepest nesting of (), [] and {} together (escaped or not; stray closers are ignored)."""
    depth = deepest = 0
    for c in text:
        if c in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in ")]}" and depth > 0:
            depth -= 1
    return deepest


def parse_plain_number(text: str) -> Decimal | None:
    """A Decimal when `text` is a plain number ("-1,080.5"), else None (anything else goes to math-verify)."""
    text = text.strip()
    if not _PLAIN_NUMBER.fullmatch(text):
        return None
    return Decimal(text.replace(",", ""))


@lru_cache(maxsize=4096)
def plain_gold(gold: str) -> Decimal | None:
    """`parse_plain_number` of a gold answer, kept: a task has few golds and every sample of a
    prompt (G per lab, every lab) is checked against the same one."""
    return parse_plain_number(gold)


def plain_answer(answer: str) -> int | Decimal | None:
    """`parse_plain_number(answer)`, or for an answer of ASCII digits only (most of them) its int,
    which compares equal to exactly the Decimals the parsed value would (a plain integer) at a
    tenth of the cost."""
    if answer.isascii() and answer.isdigit():
        return int(answer)
    return parse_plain_number(answer)


def dollar_amount(answer: str) -> int | Decimal | None:
    """The number of `\\$N` or `\\$ N` with N a plain decimal in ASCII digits, else None. (The
    plain path also reads other scripts' digits, "٧٢" = 72; math-verify does not, and this path
    gives only math-verify's verdicts.)"""
    rest = answer[len(DOLLAR):]
    if rest.startswith(" "):
        rest = rest[1:]
    if not rest or rest[0].isspace() or not rest.isascii():
        return None
    return plain_answer(rest)
