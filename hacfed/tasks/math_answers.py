"""Where a math answer is in a model's text, and whether two plain decimals are the same number.

Pure functions, no I/O, used in process by `hacfed.tasks.math_verifier` (steps 2-4 of its pipeline)
and by the math tasks: the content of the last `\\boxed{...}` (brace matching, iterative, escaped
braces skipped) and/or the last plain number; the nesting depth and the size bound (`size_refusal`) that
cap what math-verify may parse and evaluate;
and the exact `Decimal` reading of a plain decimal (optional sign, optional 1,000-style grouping) or
of a dollar amount in ASCII digits, for the numeric fast path.
"""

from __future__ import annotations

import math
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


_LOG10_SYMBOL = math.log10(2)  # a letter or a command stands for a value of at most 2 in the bounds below


def size_refusal(answer: str, max_exponent: int, max_factorial: int, max_integer_digits: int,
                 max_value_digits: int) -> str | None:
    """Why evaluating `answer` could cost seconds, or None: an integer literal of more than
    `max_integer_digits` digits, a power whose exponent may exceed `max_exponent`, a factorial of
    more than `max_factorial`, or a part whose value may have more than `max_value_digits` digits.
    math-verify's sympy evaluates integer powers and factorials exactly, inside C code that no
    signal interrupts: `9^{9999999}` or `9^{9^{9}}` runs for minutes.

    Linear in the answer's length, with recursion bounded by its brace nesting (`nesting_depth`,
    checked first). Each exponent and factorial argument is bounded from above: a product of its
    atoms (a literal's value, 2 for a letter or a command), a power's bound raised to its
    exponent's, n! as n^n; sums, differences and quotients of atoms of at least 2 never exceed
    their product. A letter stands for 2, so `e^{-x^2}` or `x^{n+1}` pass, and a numeric tower
    such as `9^{9^{9}}` is refused by the bound of its exponent."""
    try:
        _Bounds(answer, max_exponent, max_factorial, max_integer_digits, max_value_digits).log_bound(0, len(answer))
    except _TooBig as exc:
        return str(exc)
    return None


class _TooBig(Exception):
    pass


class _Bounds:
    """`size_refusal`'s scan: log10 upper bounds of the expressions between two positions."""

    def __init__(
        self, text: str, max_exponent: int, max_factorial: int, max_digits: int, max_value_digits: int,
    ) -> None:
        self.text, self.max_digits, self.max_value_digits = text, max_digits, max_value_digits
        self.log_max_exponent, self.log_max_factorial = math.log10(max_exponent), math.log10(max_factorial)

    def log_bound(self, start: int, end: int) -> float:
        """log10 of an upper bound of |value| of text[start:end] (at least log10 2), raising _TooBig."""
        text, atoms, i = self.text, [], start
        last_power = False
        while i < end:
            c = text[i]
            if c.isdigit():
                j = i
                while j < end and text[j].isdigit():
                    j += 1
                if j - i > self.max_digits:
                    raise _TooBig(f"integer literal of {j - i} digits (max {self.max_digits})")
                atoms.append(max(math.log10(int(text[i:j]) or 1), _LOG10_SYMBOL))
                i, last_power = j, False
            elif c in "{([":
                close = _closing(text, i, end)
                atoms.append(self.log_bound(i + 1, close))
                i, last_power = close + 1, False
            elif c == "^" or c == "_":
                group_start, group_end, i = _script(text, i + 1, end)
                if c == "_":
                    continue  # a subscript (`\sum_{i=1}`) bounds nothing
                if last_power:
                    raise _TooBig("a power of a power without braces")
                exponent = self.log_bound(group_start, group_end)
                if exponent > self.log_max_exponent:
                    raise _TooBig(f"an exponent that may exceed {10 ** self.log_max_exponent:.0f}")
                base = atoms.pop() if atoms else _LOG10_SYMBOL
                atoms.append(self.value(base * 10 ** exponent))
                last_power = True
            elif c == "!":
                n = atoms.pop() if atoms else _LOG10_SYMBOL
                if n > self.log_max_factorial:
                    raise _TooBig(f"a factorial of more than {10 ** self.log_max_factorial:.0f}")
                atoms.append(self.value(n * 10 ** n))  # n! <= n^n
                i, last_power = i + 1, False
            elif c.isalpha() or c == "\\":
                j = i + 1
                while j < end and text[j].isalpha():
                    j += 1
                atoms.append(_LOG10_SYMBOL)
                i, last_power = j, False
            else:
                i, last_power = i + 1, last_power and c.isspace()
        return self.value(max(sum(atoms), _LOG10_SYMBOL))

    def value(self, log_bound: float) -> float:
        """`log_bound`, when a value of that many digits may be computed; else _TooBig."""
        if log_bound >= self.max_value_digits:
            raise _TooBig(f"a value that may have more than {self.max_value_digits} digits")
        return log_bound


def _closing(text: str, i: int, end: int) -> int:
    """The position of the bracket closing text[i] (any of ), ], }), or `end` when it is unclosed."""
    depth = 0
    for j in range(i, end):
        if text[j] in "{([":
            depth += 1
        elif text[j] in "})]":
            depth -= 1
            if depth == 0:
                return j
    return end


def _script(text: str, i: int, end: int) -> tuple[int, int, int]:
    """(start, end, next position) of the group a `^` or `_` at i - 1 applies to: a braced group, a
    command with its letters, or a run of digits (an upper bound of LaTeX's single digit), else one
    character."""
    while i < end and text[i].isspace():
        i += 1
    if i >= end:
        return i, i, i
    if text[i] == "{":
        close = _closing(text, i, end)
        return i + 1, close, close + 1
    j = i + 1
    if text[i] == "\\" or text[i].isdigit():
        kind = str.isalpha if text[i] == "\\" else str.isdigit
        while j < end and kind(text[j]):
            j += 1
    return i, j, j
