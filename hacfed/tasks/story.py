"""One-step word problems in plain English, for pretrained chat models: `hacfed sim --task add2-story`.

    prompt:   "Tom has 19 apples and buys 20 more. How many apples does Tom have now? End with 'Answer: N'."
    response: "19 + 20 = 39\\nAnswer: 39"                     (the reference solution)

Each problem adds or subtracts two 2-digit numbers (10-99; a difference is never negative), told as a
short story from templates (a name, an object, an action): real text to read before the sum. A model
is a testbed on it only where it starts inside a learnable band; `bench/pretrained_testbeds.py
accuracy --task add2-story` measures that start (SmolLM2-135M-Instruct answers in long prose that
rarely ends with the marked answer).

The reward reads the response's last integer, as add2-words does, and requires it to be written as
the marked final answer `Answer: N` (markdown bold around it allowed): "so he has 39 apples.\\nAnswer: 39"
scores, "Answer: 39 apples" scores, "Answer: 39, or 40" does not (its last integer is 40), nor does a
bare "39". Digits are ASCII only, a decimal (`39.5`) is no integer, and a response over
MAX_RESPONSE_CHARS characters scores 0 (`verify_story_answer`).

Three disjoint seeded splits, stable on every machine: train, validation (for choosing settings) and
test (for the reported numbers only); no two problems, in any split, share their sum (operation and
both numbers), so the test split's arithmetic was never seen in the train split.

    task = StoryTask()
    p = task.validation_problems()[0]; task.verify(p, p.solution).reward   # 1.0
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from functools import cached_property

from hacfed.tasks.base import Problem, SplitLookup, Verdict
from hacfed.trajectory import ChatMessage

# The response budget (`max_new_tokens`); `python bench/pretrained_testbeds.py story` measures the share
# of SmolLM2-135M-Instruct's answers it cuts at this and other budgets.
STORY_MAX_NEW_TOKENS = 128
MAX_RESPONSE_CHARS = 1024
MAX_PROBLEMS = 6000
OPERATIONS = ("add", "sub")
SUFFIX = " End with 'Answer: N'."
NAMES = ("Tom", "Anna", "Ben", "Maria", "Sam", "Lily", "Omar", "Mei", "Jack", "Sara", "Ravi", "Emma")
OBJECTS = ("apples", "books", "marbles", "stickers", "pencils", "cookies", "stamps", "shells", "cards", "coins")
_TEMPLATES = {
    "add": (
        "{n} has {a} {o} and buys {b} more. How many {o} does {n} have now?",
        "{n} has {a} {o}. A friend gives {n} {b} more. How many {o} does {n} have now?",
        "{n} collects {a} {o} on Monday and {b} {o} on Tuesday. How many {o} does {n} collect in all?",
        "There are {a} {o} in a box. {n} puts {b} more {o} in the box. How many {o} are in the box now?",
    ),
    "sub": (
        "{n} has {a} {o} and gives {b} of them away. How many {o} does {n} have left?",
        "{n} has {a} {o} and loses {b}. How many {o} does {n} have now?",
        "There are {a} {o} in a box. {n} takes {b} out. How many {o} are still in the box?",
        "{n} had {a} {o} and used {b} of them. How many {o} does {n} have left?",
    ),
}
_SYMBOL = {"add": "+", "sub": "-"}
# The last integer of the text (ASCII digits, not part of a decimal or a longer number) and what comes
# right before it, to tell whether it is the marked final answer.
_LAST_INT_RE = re.compile(r"(?<![0-9.,])-?[0-9]+(?![0-9]|[.,][0-9])")
_MARKER_RE = re.compile(r"Answer:(?:\*\*)?[ \t]*(?:\*\*)?\Z")


@dataclass(frozen=True)
class StoryTask(SplitLookup):
    """Add/sub word problems (module docstring); problems alternate between the two operations."""

    seed: int = 0
    num_train: int = 4000
    num_validation: int = 200
    num_eval: int = 500

    def __post_init__(self) -> None:
        for name in ("seed", "num_train", "num_validation", "num_eval"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "seed" else 1):
                raise ValueError(f"StoryTask.{name} must be an int >= {0 if name == 'seed' else 1}, got {value!r}")
        # 8,100 sums and 4,005 differences of 2-digit numbers, drawn in turn: at most 3,000 of each.
        if self.num_train + self.num_validation + self.num_eval > MAX_PROBLEMS:
            raise ValueError(f"StoryTask: {self.num_train}+{self.num_validation}+{self.num_eval} problems requested; "
                             f"at most {MAX_PROBLEMS} in all")

    @property
    def name(self) -> str:
        return "story-addsub2"

    @property
    def max_new_tokens(self) -> int:
        """The task's own response budget (STORY_MAX_NEW_TOKENS)."""
        return STORY_MAX_NEW_TOKENS

    @property
    def verifier_ignores(self) -> str:
        """What `verify` does not check, for docs/security.md ("What a verifier does not check")."""
        return "everything before the final 'Answer: N': prose, and any arithmetic written in it"

    @cached_property
    def _all(self) -> tuple[Problem, ...]:
        rng = random.Random(f"hacfed-story:{self.seed}")
        seen: set[tuple[str, int, int]] = set()
        problems: list[Problem] = []
        while len(problems) < self.num_eval + self.num_validation + self.num_train:
            op = OPERATIONS[len(problems) % len(OPERATIONS)]
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            if op == "sub" and b >= a:
                continue
            template, name, thing = rng.choice(_TEMPLATES[op]), rng.choice(NAMES), rng.choice(OBJECTS)
            if (op, a, b) in seen:
                continue
            seen.add((op, a, b))
            problems.append(make_problem(op, a, b, template.format(n=name, a=a, b=b, o=thing)))
        return tuple(problems)

    @property
    def _splits(self) -> tuple[tuple[Problem, ...], tuple[Problem, ...]]:
        # Test first, then validation, then train: growing num_train never moves a held-out problem.
        held = self.num_eval + self.num_validation
        return self._all[held:], self._all[: self.num_eval]

    def validation_problems(self) -> tuple[Problem, ...]:
        return self._all[self.num_eval : self.num_eval + self.num_validation]

    @cached_property
    def _by_id(self) -> dict[str, Problem]:
        return {p.prompt_id: p for p in self._all}

    def verify(self, problem: Problem, response: str) -> Verdict:
        return verify_story_answer(problem.answer, response)


def make_problem(op: str, a: int, b: int, story: str) -> Problem:
    answer = a + b if op == "add" else a - b
    return Problem(
        prompt_id=f"story:{a}{_SYMBOL[op]}{b}", messages=(ChatMessage("user", story + SUFFIX),),
        answer=str(answer), solution=f"{a} {_SYMBOL[op]} {b} = {answer}\nAnswer: {answer}",
    )


def verify_story_answer(gold: str, response: str) -> Verdict:
    """Reward 1 iff the response's last integer is the marked final answer `Answer: N` and equals gold."""
    if not isinstance(response, str):
        return Verdict(0.0, "response is not text")
    if len(response) > MAX_RESPONSE_CHARS:
        return Verdict(0.0, "response too long")
    found = list(_LAST_INT_RE.finditer(response))
    if not found:
        return Verdict(0.0, "no integer in the response")
    last = found[-1]
    if _MARKER_RE.search(response[: last.start()].rstrip(" \t")) is None:
        return Verdict(0.0, "the last integer is not a final 'Answer: N'")
    return Verdict(1.0, "exact match") if int(last.group()) == int(gold) else Verdict(0.0, "wrong answer")
