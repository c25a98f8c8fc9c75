"""Multi-step arithmetic with a worked solution: hacfed's testbed in the paper's regime.

HACPO's cross-agent ratio is a per-token geometric mean over the response. The paper's responses
run to hundreds of tokens, where that mean concentrates; over the 2-4 tokens of the quick addition
task it is mostly noise. Here every answer shows its intermediate steps and ends in a marked final
answer, so responses are 20-40 tokens under every zoo tokenizer, while the models stay CPU-sized:

    prompt:   "47+28+15="
    response: "47+28=75\\n75+15=90\\nAnswer: 90"

The reward checks the final answer (the last line must be `Answer: <integer>`), as the paper's
reward checks the last `\\boxed{}`, and every worked step the response shows: each `a+b=c` or
`a-b=c` before the final line must be true and its numbers within the task's range (0 to
`max_value`), else the reward is 0 (`verify_worked_chain`). So a success never teaches a peer
false arithmetic, and its steps carry no number the task could not produce. Text between the steps
is not read by the verifier (`verifier_ignores`): a success is held to steps only by the response
format (`hacfed.response_format`). A problem is one chain of a single operation: the
task mix is addition chains ("add") and subtraction chains ("sub"). Subtraction chains start from a
three-digit number and every running value stays >= 0. A prompt can also be written in words
(`What is 47 plus 28 plus 15?`, the "word" notation) with the same worked solution. Agents can be
warmed up on different halves of the mix, by operation or by notation: the complementary-skills
settings.

Three disjoint seeded splits, stable on every machine: train, validation (for choosing settings)
and held-out test (for the reported numbers only).

    task = ChainTask(terms=3, operations=("add", "sub"))
    p = task.eval_problems()[0]; task.verify(p, p.solution).reward   # 1.0
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from functools import cached_property

from hacfed.tasks.base import Problem, SplitLookup, Verdict
from hacfed.trajectory import ChatMessage

OPERATIONS = ("add", "sub")
NOTATIONS = ("sym", "word")
_SYMBOL = {"add": "+", "sub": "-"}
_WORD = {"add": "plus", "sub": "minus"}
_FINAL_RE = re.compile(r"Answer: (-?\d{1,12})")
# A worked step anywhere in a line: two or more sums of terms joined by `=` (`a+b=c`, `a-b=c`,
# `a+b-c=d`, `a+b=c=d`, `c=d`, `a+b=c+d`), spaces allowed, any term possibly negative. A match starts
# where a sum starts (not after a digit, a sign or `=`), so `47+28+15=90` is read whole, never as
# `28+15=90`.
_SUM = r"-?[ \t]*\d+(?:[ \t]*[+-][ \t]*\d+)*"
_STEP_RE = re.compile(rf"(?<![\d+=-]){_SUM}(?:[ \t]*=[ \t]*{_SUM})+")
_TERM_RE = re.compile(r"([+-]?)[ \t]*(\d+)")
MAX_RESPONSE_CHARS = 512


@dataclass(frozen=True)
class ChainTask(SplitLookup):
    """terms: numbers per chain (steps = terms - 1). operations: which halves of the mix to draw.

    Addition chains add `terms` two-digit numbers; subtraction chains start from a number in
    [100, 299] and subtract `terms - 1` two-digit numbers, never going below 0. Problems alternate
    between the listed operations, so a split is balanced between them.

    notations: how prompts are written. "sym" is `47+28+15=`; "word" asks the same chain in words,
    `What is 47 plus 28 plus 15?`. The worked solution is the same in both, so only reading the
    prompt differs. With both listed, problems alternate between them in pairs (so each notation
    holds both operations); the arithmetic of every split is the same whatever the notations, so
    a model warmed up in one notation never saw a validation or test problem of the mix.

    other_train: the train split also holds the first `other_train` train problems of the other
    half (0 by default): of the operations *not* listed when only some are, else written in the
    notation not listed. A specialist warmed up on it has seen a little of the other half, so it
    rarely, rather than never, solves it; its validation and test splits stay its own half, so
    the warm-up's band is the specialist's own half.
    """

    terms: int = 3
    operations: tuple[str, ...] = OPERATIONS
    seed: int = 0
    num_train: int = 8000
    num_validation: int = 1000
    num_eval: int = 1000
    other_train: int = 0
    notations: tuple[str, ...] = ("sym",)

    def __post_init__(self) -> None:
        if isinstance(self.terms, bool) or not isinstance(self.terms, int) or not 2 <= self.terms <= 6:
            raise ValueError(f"ChainTask.terms must be an int in [2, 6], got {self.terms!r}")
        ops = tuple(self.operations) if isinstance(self.operations, (list, tuple)) else None
        if not ops or any(op not in OPERATIONS for op in ops) or len(set(ops)) != len(ops):
            raise ValueError(
                f"ChainTask.operations must be a non-empty subset of {OPERATIONS}, got {self.operations!r}"
            )
        object.__setattr__(self, "operations", ops)
        notes = tuple(self.notations) if isinstance(self.notations, (list, tuple)) else None
        if not notes or any(n not in NOTATIONS for n in notes) or len(set(notes)) != len(notes):
            raise ValueError(f"ChainTask.notations must be a non-empty subset of {NOTATIONS}, got {self.notations!r}")
        object.__setattr__(self, "notations", notes)
        for name in ("num_train", "num_validation", "num_eval"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ChainTask.{name} must be an int >= 1, got {value!r}")
        if isinstance(self.other_train, bool) or not isinstance(self.other_train, int) or self.other_train < 0:
            raise ValueError(f"ChainTask.other_train must be an int >= 0, got {self.other_train!r}")
        if self.other_train and set(ops) == set(OPERATIONS) and set(notes) == set(NOTATIONS):
            raise ValueError("ChainTask.other_train needs a subset of the operations or of the notations: "
                             "every operation and notation is already listed")
        if self.other_train > self.num_train:
            raise ValueError(f"ChainTask.other_train ({self.other_train}) must be <= num_train ({self.num_train})")
        if self.num_train + self.num_validation + self.num_eval > 200_000:
            raise ValueError("ChainTask: at most 200000 problems in all")

    @property
    def name(self) -> str:
        base = f"chain{self.terms}-{'-'.join(self.operations)}"
        if self.notations != ("sym",):
            base += "-" + "-".join(self.notations)
        return f"{base}+{self.other_train}" if self.other_train else base

    @cached_property
    def _all(self) -> tuple[tuple[Problem, ...], tuple[Problem, ...], tuple[Problem, ...]]:
        # One generator for the whole mix, whatever subset of operations this task draws: the
        # splits of ChainTask(operations=("add",)) are the add problems of the full mix's splits,
        # so a specialist's warm-up never sees a validation or test problem of the mix.
        rng = random.Random(f"hacfed-chain:{self.terms}:{self.seed}")
        seen: set[tuple[str, tuple[int, ...]]] = set()
        sizes = (self.num_eval, self.num_validation, self.num_train)  # test first: growing train never moves it
        splits: list[list[Problem]] = [[], [], []]
        k, others = 0, 0
        for index, (split, size) in enumerate(zip(splits, sizes)):
            drawn = 0
            while drawn < size:
                op = OPERATIONS[k % len(OPERATIONS)]
                numbers = _draw(rng, op, self.terms)
                if (op, numbers) in seen:  # the same chain, whatever its notation
                    continue
                seen.add((op, numbers))
                problem = make_problem(op, numbers, self.notations[(k // 2) % len(self.notations)])
                k += 1
                drawn += 1
                if op in self.operations:
                    split.append(problem)
                elif index == 2 and others < self.other_train:  # the train split; another operation
                    split.append(problem)
                    others += 1
        if self.other_train and set(self.operations) == set(OPERATIONS):
            # The other half is the other notation: the first train problems, written in it.
            other = next(n for n in NOTATIONS if n not in self.notations)
            splits[2].extend(_rewrite(p, other) for p in splits[2][: self.other_train])
        test, validation, train = (tuple(s) for s in splits)
        return train, validation, test

    @property
    def _splits(self) -> tuple[tuple[Problem, ...], tuple[Problem, ...]]:
        train, _validation, test = self._all
        return train, test

    def validation_problems(self) -> tuple[Problem, ...]:
        return self._all[1]

    @cached_property
    def _by_id(self) -> dict[str, Problem]:
        return {p.prompt_id: p for split in self._all for p in split}

    @property
    def max_value(self) -> int:
        """The largest number a problem of this task holds, operand or running value: an addition
        chain's sum (at most 99 per term) or a subtraction chain's start (at most 299)."""
        return max(99 * self.terms, 299)

    @property
    def verifier_ignores(self) -> str:
        """What `verify` does not check, for docs/security.md and the response format."""
        return ("text between the worked steps (prose, a canary on its own line): the response format "
                "holds a success to steps and the final line only")

    def verify(self, problem: Problem, response: str) -> Verdict:
        return verify_worked_chain(problem.answer, response, self.max_value)

    def answer_of(self, response: str) -> str | None:
        """The answer a response gives (its last line `Answer: N`), as `verify` reads it; None for none."""
        last = response.rstrip().rsplit("\n", 1)[-1].strip() if len(response) <= MAX_RESPONSE_CHARS else ""
        match = _FINAL_RE.fullmatch(last)
        return str(int(match.group(1))) if match else None

    def half_of(self, problem: Problem) -> str | None:
        """Which half of this task's mix a problem is, for per-half scores: its notation when the
        mix has both, else its operation when it has both, else None (one half only)."""
        if len(self.notations) > 1:
            return notation_of(problem)
        return operation_of(problem) if len(self.operations) > 1 else None


def _draw(rng: random.Random, op: str, terms: int) -> tuple[int, ...]:
    while True:
        if op == "add":
            return tuple(rng.randint(10, 99) for _ in range(terms))
        start = rng.randint(100, 299)
        rest = tuple(rng.randint(10, 99) for _ in range(terms - 1))
        if start - sum(rest) >= 0:
            return (start, *rest)


def make_problem(op: str, numbers: tuple[int, ...], notation: str = "sym") -> Problem:
    """The problem `n0 op n1 op ...=` (or, in "word" notation, `What is n0 plus n1 ...?`) with its
    worked solution, one step per line."""
    sym = _SYMBOL[op]
    expr = sym.join(str(n) for n in numbers)
    lines = []
    value = numbers[0]
    for n in numbers[1:]:
        nxt = value + n if op == "add" else value - n
        lines.append(f"{value}{sym}{n}={nxt}")
        value = nxt
    lines.append(f"Answer: {value}")
    if notation == "word":
        prompt_id, text = f"chain-{op}-word:{expr}", f"What is {f' {_WORD[op]} '.join(map(str, numbers))}?"
    else:
        prompt_id, text = f"chain-{op}:{expr}", f"{expr}="
    return Problem(
        prompt_id=prompt_id,
        messages=(ChatMessage("user", text),),
        answer=str(value),
        solution="\n".join(lines),
    )


def _rewrite(problem: Problem, notation: str) -> Problem:
    """The same chain, its prompt written in `notation` (the prompt id keeps the numbers)."""
    op, expr = operation_of(problem), problem.prompt_id.split(":", 1)[1]
    return make_problem(op, tuple(int(n) for n in expr.split(_SYMBOL[op])), notation)


def operation_of(problem: Problem) -> str:
    """"add" or "sub": which half of the mix a chain problem belongs to."""
    return problem.prompt_id.split(":", 1)[0].removeprefix("chain-").split("-", 1)[0]


def notation_of(problem: Problem) -> str:
    """"sym" or "word": how a chain problem's prompt is written."""
    return "word" if problem.prompt_id.split(":", 1)[0].endswith("-word") else "sym"


def verify_worked_chain(gold: str, response: str, max_value: int) -> Verdict:
    """Reward 1 iff the response's last line is `Answer: <gold>` (`verify_final_answer`) and every
    worked step before it (sums joined by `=`: `a+b=c`, `a-b=c`, `a+b-c=d`, `c=d`, anywhere in a line)
    is true, with every number and every sum in [0, max_value]; the steps need not be the problem's
    own (a true detour is no lie)."""
    verdict = verify_final_answer(gold, response)
    if verdict.reward <= 0:
        return verdict
    text = response.rstrip()
    body = text.rsplit("\n", 1)[0] if "\n" in text else ""
    # Every digit run is at most MAX_RESPONSE_CHARS long (verify_final_answer checked the length), so
    # int() of it is cheap and never over Python's 4,300-digit limit.
    for step in _STEP_RE.finditer(body):
        sides = [[-int(n) if sign == "-" else int(n) for sign, n in _TERM_RE.findall(side)]
                 for side in step.group().split("=")]
        values = [sum(terms) for terms in sides]
        if any(v != values[0] for v in values):
            return Verdict(0.0, f"false step {_shown(step.group())}")
        numbers = [n for terms in sides for n in (terms[0], *map(abs, terms[1:]))]  # a side may not start below 0
        if not all(0 <= n <= max_value for n in (*numbers, *values)):
            return Verdict(0.0, f"step {_shown(step.group())} outside the task's range [0, {max_value}]")
    return verdict


def _shown(step: str) -> str:
    """A step as a verdict quotes it: at most 40 characters."""
    step = step.strip()
    return repr(step if len(step) <= 40 else step[:37] + "...")


def verify_final_answer(gold: str, response: str) -> Verdict:
    """Reward 1 iff the response's last line is `Answer: <gold>`; the steps are not checked (the
    task's verifier, `verify_worked_chain`, checks them too)."""
    if not isinstance(response, str):
        return Verdict(0.0, "response is not text")
    if len(response) > MAX_RESPONSE_CHARS:
        return Verdict(0.0, "response too long")
    last = response.rstrip().rsplit("\n", 1)[-1].strip()
    match = _FINAL_RE.fullmatch(last)
    if match is None:
        return Verdict(0.0, "no final 'Answer: N' line")
    return Verdict(1.0, "exact match") if int(match.group(1)) == int(gold) else Verdict(0.0, "wrong answer")
