"""The form of a lab's answers, and how far it drifts from the form it started in.

A learner pulled towards a partner's text may change how it answers (a pretrained model that wrote
"The answer is 80." starts writing a bare "80") before its accuracy shows it. The form of an answer
is a coarse class of its last non-empty line:

  number-only ...... the line is a number, optionally with a trailing period ("80", "-3.5.")
  number-in-text ... the line holds a digit among other text ("The answer is 80.")
  no-number ........ the line holds no digit
  empty ............ the response is blank

`AnswerFormDrift` fixes the starting form at the first rollout it sees (its most common form) and
then reports, every round, the share of the lab's answers still in that form. Its state (the
starting form) is saved in the lab's checkpoint.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Iterable

__all__ = ["FORMS", "answer_form", "AnswerFormDrift"]

FORMS = ("number-only", "number-in-text", "no-number", "empty")
_NUMBER_ONLY = re.compile(r"[-+]?\d[\d,]*(\.\d+)?\.?")


def answer_form(text: str) -> str:
    """The form of one response (module docstring)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return "empty"
    last = lines[-1]
    if _NUMBER_ONLY.fullmatch(last):
        return "number-only"
    return "number-in-text" if any(ch.isdigit() for ch in last) else "no-number"


class AnswerFormDrift:
    """The starting form of a lab's answers, and the share of each later rollout still in it."""

    def __init__(self, start: str | None = None) -> None:
        if start is not None and start not in FORMS:
            raise ValueError(f"answer form must be one of {FORMS}, got {start!r}")
        self.start = start

    def observe(self, texts: Iterable[str]) -> float | None:
        """The share of `texts` in the starting form (fixed here at the first non-empty call, to
        the most common form, ties in FORMS order); None for no texts."""
        forms = [answer_form(t) for t in texts]
        if not forms:
            return None
        if self.start is None:
            counts = Counter(forms)
            self.start = max(FORMS, key=lambda f: (counts[f], -FORMS.index(f)))
        return sum(f == self.start for f in forms) / len(forms)
