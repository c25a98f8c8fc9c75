"""Synthetic verifiable arithmetic: `a+b=` / `a-b=` / `a*b=` with verified integer rewards.

Problems are drawn from a seeded RNG, so the train/held-out split and every prompt id are the same
on every machine and run: the prompt id is the expression itself (e.g. ``add2:37+58``).

Two prompt styles:

  "symbols" (default)  `37+58=`, for models trained from scratch; reward 1 iff the whole response
                       is the answer (`verify_exact_integer`)
  "words"              `What is 37 + 58? Reply with only the number.` (`a * b` reads `a times b`),
                       for pretrained chat models; reward 1 iff the last integer of the response is
                       the answer (`verify_last_integer`: "The answer is 95." scores). Prompt ids
                       carry a `w` (``add2w:37+58``); the problems are the symbols style's, in the
                       same splits.

The reference solution (`Problem.solution`, what a supervised warm-up teaches) is the bare answer;
with `solution_form="worked"` (words style only) it is the sum written out, `37 + 58 = 95`, the form
SmolLM2-135M-Instruct answers in, so a partner warmed up on it writes text a pretrained chat model
finds likely. Prompts, prompt ids, splits and the verifier are the same in both forms.

    task = ArithmeticTask(digits=2, operators="+")
    p = task.train_problems()[0]; task.verify(p, "95").reward
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from functools import cached_property

from hacfed.tasks.base import Problem, SplitLookup, Verdict
from hacfed.trajectory import ChatMessage

_OPS = {"+": "add", "-": "sub", "*": "mul"}
_WORDS = {"+": "+", "-": "-", "*": "times"}
STYLES = ("symbols", "words")
SOLUTION_FORMS = ("answer", "worked")
WORDS_TEMPLATE = "What is {a} {op} {b}? Reply with only the number."
# The words style's response budget (`max_new_tokens`), from bench/arith_words.py on
# SmolLM2-135M-Instruct (the first 48 validation problems of `hacfed sim --task add2-words`).
# Greedy answers take 17.5 tokens on average ("92 + 56 = 140"), 10 % run past 48, none past 76,
# 27 % are right. Sampled at temperature 1 (as rollouts are) they often run on into prose that has
# lost the sum: at 48 tokens 37.5 % were cut and 2 of 48 right, at 96 tokens 15 % cut and 4 of 48
# right, for 1.8x the rollout time and 1.5x the training time of a `hacfed sim` round. 48 keeps
# rounds cheap; a cut answer scores what it says so far (usually nothing), which rewards ending.
WORDS_MAX_NEW_TOKENS = 48
_INT_RE = re.compile(r"-?\d+")
# An integer as a chat model writes it: optional sign, optional thousands separators, not part of a decimal.
_LAST_INT_RE = re.compile(r"(?<![\d.,])-?\d{1,3}(?:,\d{3})+(?![\d,]|\.\d)|(?<![\d.,])-?\d+(?![\d,]|\.\d)")


@dataclass(frozen=True)
class ArithmeticTask(SplitLookup):
    """digits: max digits per operand (difficulty). operators: any of "+-*".
    Subtraction keeps the result non-negative (the larger operand comes first).
    style: "symbols" or "words" (module docstring)."""

    digits: int = 2
    operators: str = "+"
    seed: int = 0
    num_train: int = 4000
    num_eval: int = 200
    num_validation: int = 0  # for choosing settings; drawn after train, so old splits never move
    style: str = "symbols"
    solution_form: str = "answer"  # the reference solution: "answer" (95) or "worked" (37 + 58 = 95)

    def __post_init__(self) -> None:
        if isinstance(self.digits, bool) or not isinstance(self.digits, int) or not 1 <= self.digits <= 9:
            raise ValueError(f"ArithmeticTask.digits must be an int in [1, 9], got {self.digits!r}")
        ops = self.operators
        if not ops or any(op not in _OPS for op in ops) or len(set(ops)) != len(ops):
            raise ValueError(f"ArithmeticTask.operators must be a non-empty set of '+-*', got {self.operators!r}")
        if self.style not in STYLES:
            raise ValueError(f"ArithmeticTask.style must be one of {STYLES}, got {self.style!r}")
        if self.solution_form not in SOLUTION_FORMS:
            raise ValueError(f"ArithmeticTask.solution_form must be one of {SOLUTION_FORMS}, "
                             f"got {self.solution_form!r}")
        if self.solution_form == "worked" and self.style != "words":
            raise ValueError("ArithmeticTask.solution_form 'worked' needs style 'words' (the symbols style's verifier "
                             f"reads one integer only), got style {self.style!r}")
        if self.num_train < 1 or self.num_eval < 1 or self.num_validation < 0:
            raise ValueError(
                f"ArithmeticTask needs num_train/num_eval >= 1 and num_validation >= 0, got "
                f"{self.num_train}/{self.num_eval}/{self.num_validation}"
            )
        space = (10 ** self.digits) ** 2 * len(self.operators)
        if self.num_train + self.num_eval + self.num_validation > space // 2:
            raise ValueError(
                f"ArithmeticTask: {self.num_train}+{self.num_eval}+{self.num_validation} problems requested but "
                f"only {space} distinct {self.digits}-digit problems exist; lower num_train/num_eval or raise digits"
            )

    @property
    def verifier_ignores(self) -> str:
        """What `verify` does not check, for docs/security.md ("What a verifier does not check")."""
        if self.style == "symbols":
            return "nothing: the whole response must be the integer"
        return "everything before the last integer: prose, and any arithmetic written in it"

    @property
    def max_new_tokens(self) -> int | None:
        """The task's own response budget: WORDS_MAX_NEW_TOKENS for the words style; None (the
        caller's) for symbols."""
        return WORDS_MAX_NEW_TOKENS if self.style == "words" else None

    @property
    def name(self) -> str:
        ops = "".join(_OPS[o] for o in self.operators)
        worked = "-worked" if self.solution_form == "worked" else ""
        return f"arith-{ops}{self.digits}" + ("-words" if self.style == "words" else "") + worked

    @cached_property
    def _all(self) -> tuple[Problem, ...]:
        rng = random.Random(f"hacfed-arith:{self.digits}:{self.operators}:{self.seed}")
        seen: set[str] = set()
        problems: list[Problem] = []
        hi = 10**self.digits - 1
        while len(problems) < self.num_train + self.num_eval + self.num_validation:
            a, b = rng.randint(0, hi), rng.randint(0, hi)
            op = self.operators[rng.randrange(len(self.operators))]
            if op == "-" and b > a:
                a, b = b, a
            expr = f"{a}{op}{b}"
            if expr in seen:
                continue
            seen.add(expr)
            problems.append(_make_problem(self.digits, op, a, b, self.style, self.solution_form))
        return tuple(problems)

    @property
    def _splits(self) -> tuple[tuple[Problem, ...], tuple[Problem, ...]]:
        # Held-out first so growing num_train never moves a problem between splits.
        end = self.num_eval + self.num_train
        return self._all[self.num_eval : end], self._all[: self.num_eval]

    def validation_problems(self) -> tuple[Problem, ...]:
        return self._all[self.num_eval + self.num_train :]

    @cached_property
    def _by_id(self) -> dict[str, Problem]:
        return {p.prompt_id: p for p in self._all}

    def answer_of(self, response: str) -> str | None:
        """The answer a response gives, as `verify` reads it (the whole response for symbols, the last
        integer for words), in the canonical form of `Problem.answer`; None for none."""
        if self.style == "words":
            found = _LAST_INT_RE.findall(response)
            digits = found[-1].replace(",", "") if found else ""
        else:
            digits = response.strip()
        if not _INT_RE.fullmatch(digits) or len(digits) > 64:
            return None
        return str(int(digits))

    def verify(self, problem: Problem, response: str) -> Verdict:
        if self.style == "words":
            return verify_last_integer(problem.answer, response)
        return verify_exact_integer(problem.answer, response)


def _make_problem(digits: int, op: str, a: int, b: int, style: str = "symbols",
                  solution_form: str = "answer") -> Problem:
    answer = a + b if op == "+" else a - b if op == "-" else a * b
    solution = f"{a} {op} {b} = {answer}" if solution_form == "worked" else str(answer)
    expr = f"{a}{op}{b}"
    if style == "words":
        prompt_id, text = f"{_OPS[op]}{digits}w:{expr}", WORDS_TEMPLATE.format(a=a, op=_WORDS[op], b=b)
    else:
        prompt_id, text = f"{_OPS[op]}{digits}:{expr}", f"{expr}="
    return Problem(prompt_id=prompt_id, messages=(ChatMessage("user", text),), answer=str(answer),
                   solution=solution)


def verify_exact_integer(gold: str, response: str) -> Verdict:
    """Reward 1 iff the response, stripped of surrounding whitespace, is exactly the gold integer."""
    if not isinstance(response, str):
        return Verdict(0.0, "response is not text")
    text = response.strip()
    if not text:
        return Verdict(0.0, "empty response")
    if len(text) > 64:
        return Verdict(0.0, "response too long for an integer answer")
    if not _INT_RE.fullmatch(text):
        return Verdict(0.0, "not an integer")
    return Verdict(1.0, "exact match") if int(text) == int(gold) else Verdict(0.0, "wrong answer")


def verify_last_integer(gold: str, response: str) -> Verdict:
    """Reward 1 iff the last integer in the response is the gold integer ("The answer is 80." -> 80).
    Thousands separators are read ("1,080"); a decimal such as "80.5" is not an integer and is skipped."""
    if not isinstance(response, str):
        return Verdict(0.0, "response is not text")
    found = _LAST_INT_RE.findall(response)
    if not found:
        return Verdict(0.0, "no integer in the response")
    digits = found[-1].replace(",", "")
    if len(digits) > 64:  # no gold answer is this long; int() of over 4,300 digits would raise
        return Verdict(0.0, "last integer too long for an answer")
    return Verdict(1.0, "last integer matches") if int(digits) == int(gold) else Verdict(0.0, "wrong answer")
