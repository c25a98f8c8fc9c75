"""A task's response format: what a verified success must look like to be usable as a peer's text.

Pure (no model, no torch), so both sides may import it: a lab's inbound filter
(`hacfed.clients.textfilter`) refuses a peer's group that holds a sample outside the format, and the
coordinator's `format_gate` credits every success of such a group 0 for P̂ and ranks the group last in
the `successes` pool choice (`hacfed.capability.credit_successes`,
`hacfed.server.coordinator.success_credit`; docs/security.md, "Inbound checks on peer text").

The format of a built-in task is read off its verifier: at most `max_chars` characters; and a success
(verified reward > 0) holds only printable text, newlines and tabs (no control or format character:
no terminal escape, bidi override or zero-width character) and is written in the task's answer form
(chain: at most `terms - 1` worked steps `a+b=c` with numbers of the task's size and a last line
`Answer: N`; add2: one integer; add2-words: an integer; add2-story: a final `Answer: N`; a math task:
the `\\boxed{}` or number its verifier reads). A failure is held to the length alone. What each
verifier leaves unread is said in docs/security.md ("What a verifier does not check").

    fmt = response_format(task)
    fmt.why_not("1+2=3\\nAnswer: 3", 1.0)   # None: it fits
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from hacfed.tasks.arithmetic import ArithmeticTask
from hacfed.tasks.base import Task
from hacfed.tasks.chain import MAX_RESPONSE_CHARS, ChainTask
from hacfed.tasks.math_data import MathDataTask
from hacfed.tasks.math_verifier import MathVerifierConfig
from hacfed.tasks.story import MAX_RESPONSE_CHARS as STORY_MAX_CHARS
from hacfed.tasks.story import StoryTask

# A response cap for a task whose verifier has none: the math verifier's default (hacfed.tasks.math_verifier).
# Read from the field's default: building a MathVerifierConfig checks the sandbox's network isolation,
# which an import must not do (hacfed-server imports this and refuses a host without isolation itself).
GENERIC_MAX_CHARS = MathVerifierConfig.__dataclass_fields__["max_response_chars"].default
_ASCII_BAD = re.compile(r"[^\x20-\x7e\n\t]")
_BAD_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})  # controls, format, unassigned, separators


@dataclass(frozen=True)
class ResponseFormat:
    """A task's response format. success: what a success's stripped text must match (re.search);
    marker: the same in words, for messages and docs."""

    task: str
    max_chars: int
    success: re.Pattern[str]
    marker: str

    def why_not(self, text: str, reward: float) -> str | None:
        """Why `text` does not fit the format (None when it fits); `reward`: its verified reward."""
        if len(text) > self.max_chars:
            return f"longer than {self.max_chars} characters"
        if reward <= 0:
            return None
        bad = _bad_character(text)
        if bad is not None:
            return f"character {ascii(bad)} is not allowed"
        if self.success.search(text.strip()) is None:
            return f"a success without {self.marker}"
        return None

    def fits(self, text: str, reward: float) -> bool:
        """Whether `text`, of verified reward `reward`, fits the format."""
        return self.why_not(text, reward) is None


def response_format(task: Task) -> ResponseFormat:
    """The response format of a built-in task, from what its verifier reads; a generic one (printable
    text within GENERIC_MAX_CHARS, no answer form) for any other task, a plugin's included."""
    if isinstance(task, ChainTask):
        return ResponseFormat(task.name, MAX_RESPONSE_CHARS, chain_success(task),
                              "the worked steps 'a+b=c' and a last line 'Answer: N' only")
    if isinstance(task, ArithmeticTask) and task.style == "symbols":  # verify_exact_integer: <= 64 characters
        return ResponseFormat(task.name, 64, re.compile(r"\A-?\d+\Z"), "one integer only")
    if isinstance(task, ArithmeticTask):  # words: the last integer of free text
        return ResponseFormat(task.name, GENERIC_MAX_CHARS, re.compile(r"\d"), "an integer")
    if isinstance(task, StoryTask):  # verify_story_answer: the last integer, marked `Answer: N`
        return ResponseFormat(task.name, STORY_MAX_CHARS, re.compile(r"Answer:"), "a final 'Answer: N'")
    if isinstance(task, MathDataTask):
        mode = task.verifier.answer_mode
        success, marker = {"boxed": (r"\\boxed", "a \\boxed{} answer"), "last_number": (r"\d", "a number")}.get(
            mode, (r"\\boxed|\d", "a \\boxed{} answer or a number"))
        return ResponseFormat(task.name, task.verifier.max_response_chars, re.compile(success), marker)
    return ResponseFormat(getattr(task, "name", "task"), GENERIC_MAX_CHARS, re.compile(""), "an answer")


def chain_success(task: ChainTask) -> re.Pattern[str]:
    """What a chain success must be: at most `terms - 1` worked steps `a+b=c` / `a-b=c`, one a line,
    and a last line `Answer: N`, every number ASCII digits no longer than the task's largest
    (`max_value`; the verifier checks the values and the steps' truth), so a success has no room for a
    number the task could not produce."""
    number = rf"[0-9]{{1,{len(str(task.max_value))}}}"
    step = rf"[ \t]*{number}[+-]{number}={number}[ \t]*\n"
    return re.compile(rf"\A(?:{step}){{0,{task.terms - 1}}}[ \t]*Answer: {number}\Z")


def _bad_character(text: str) -> str | None:
    """The first character that is not printable text, a newline or a tab."""
    if text.isascii():
        found = _ASCII_BAD.search(text)
        return None if found is None else found.group()
    for ch in text:
        if ch not in "\n\t" and unicodedata.category(ch) in _BAD_CATEGORIES:
            return ch
    return None


__all__ = ["chain_success", "GENERIC_MAX_CHARS", "ResponseFormat", "response_format"]
