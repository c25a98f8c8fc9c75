"""What a lab lets through: peers' text before it trains its learner, its own text before it is sent.

Runs in a lab's participant (`hacfed.clients.participant`, in hacfed-client and `hacfed sim`); pure:
no model, no torch. Two filters, each switched by the lab's `[participant]` table
(`hacfed.clients.participant_config`):

inbound (`inbound_filter`, on by default): each peer sample of the pool must
  1. fit the task's response format (`hacfed.response_format`, which the coordinator's
     `format_gate` applies too): at most `max_chars` characters (what the
     task's verifier reads); and a success (verified reward > 0) must hold only printable text,
     newlines and tabs (no control or format character: no terminal escape, bidi override or
     zero-width character) and be written in the task's answer form (chain: only worked steps
     `a+b=c` and a last line `Answer: N`; add2: one integer; add2-words: an integer; a math task:
     the `\\boxed{}` or number its verifier reads);
  2. match none of the deny-list: the regular expressions `deny_patterns` (by default a URL with a
     scheme or `www.`, and an e-mail address) and the literal strings `deny_strings` (known canaries).
     The text and the deny-list are folded alike first (`hacfed.textfold`): case, Unicode
     compatibility forms, look-alike letters and punctuation, zero-width and format characters, and
     the spelled-out `(at)` / `(dot)`; each pattern (matched without regard to case) must find
     nothing in the folded text nor in the folded text without whitespace, and each literal, folded
     and without whitespace, must not occur in the latter: a canary split by a line break is found.
  A failure is held to the length and the deny-list only: its advantage is never positive, so its
  text is pushed down, not learnt, and an honest model's failures hold whatever it sampled (a
  byte-level model writes a control byte now and then).
  A peer's sample that fails is left out with the rest of that peer's group for the prompt (a group
  with some samples taken out would bias the prompt's baseline, which an attacker could steer) and
  counted (`skipped_filter`). The learner's own samples come back in the pool and are not checked.

outbound (`outbound_filter`, on by default): the deny-list alone, on the lab's own samples before
  they are sent; the format is not checked (a lab's own failures are often malformed, and sending
  them is no leak). A group with any flagged sample is withheld whole (`withheld_outbound`), since
  the coordinator takes exactly G samples per prompt or none (INCOMPLETE-GROUP): a replaced sample
  would be text the model never wrote, with a log-prob claim that is not its own.

What this cannot do: a deny-list finds only what it names (a bare domain such as `evil.example` is
not a URL to the default list; a canary paraphrased, spelled out letter by letter or encoded
passes), and the format bounds where text can go but cannot tell a trigger phrase written in plain
words in a free-text answer (add2-words, gsm8k) from honest prose.

    flt = inbound(task, deny_patterns=DEFAULT_DENY_PATTERNS, deny_strings=("see-evil.example",))
    kept, dropped = filter_pool(pool, "lab-a", flt)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Iterable, Sequence

from hacfed.response_format import ResponseFormat, response_format
from hacfed.textfold import fold, squeeze, views
from hacfed.trajectory import Trajectory

# A URL with a scheme or starting `www.`; an e-mail address (the lookbehind starts a match only where
# a run of address characters starts, so a long run without `@` is read once). No word boundary before
# the scheme or `www`: in the text without whitespace (`views`) the word before runs into it.
URL_PATTERN = r"(?i)(?:https?|ftp|file)://|www\.[a-z0-9-]+\."
EMAIL_PATTERN = r"(?i)(?<![a-z0-9._%+-])[a-z0-9._%+-]+@[a-z0-9-]+(?:\.[a-z0-9-]+)*\.[a-z]{2,}"
DEFAULT_DENY_PATTERNS = (URL_PATTERN, EMAIL_PATTERN)
__all__ = ["DEFAULT_DENY_PATTERNS", "ResponseFormat", "TextFilter", "check_task_solutions", "filter_pool",
           "filters_for", "inbound", "outbound", "response_format", "withhold_groups"]


@dataclass(frozen=True)
class TextFilter:
    """A lab's check of sample text: a format (None: not checked) and a deny-list."""

    format: ResponseFormat | None
    deny_patterns: tuple[re.Pattern[str], ...]
    deny_strings: tuple[str, ...]

    def __post_init__(self) -> None:
        for literal in self.deny_strings:
            if not squeeze(fold(literal)):
                raise ValueError(f"deny string {literal!r} is nothing once folded (hacfed.textfold): name text")

    @cached_property
    def _folded_strings(self) -> tuple[tuple[str, str], ...]:
        """(literal, the literal folded and without whitespace) of each deny string."""
        return tuple((literal, squeeze(fold(literal))) for literal in self.deny_strings)

    def why_not(self, t: Trajectory) -> str | None:
        """Why `t` may not pass (None when it may)."""
        text = t.response_text
        if self.format is not None:
            reason = self.format.why_not(text, t.reward)
            if reason is not None:
                return reason
        if not self.deny_patterns and not self.deny_strings:
            return None
        folded, squeezed = views(text)
        for pattern in self.deny_patterns:
            if pattern.search(folded) is not None or pattern.search(squeezed) is not None:
                return f"matches deny pattern {pattern.pattern!r}"
        for literal, bare in self._folded_strings:
            if bare in squeezed:
                return f"contains {literal!r}"
        return None


def inbound(task: Any, deny_patterns: Iterable[str] = DEFAULT_DENY_PATTERNS,
            deny_strings: Iterable[str] = ()) -> TextFilter:
    """The filter for peers' samples: the task's format and the deny-list."""
    return TextFilter(response_format(task), _compiled(deny_patterns), tuple(deny_strings))


def outbound(deny_patterns: Iterable[str] = DEFAULT_DENY_PATTERNS, deny_strings: Iterable[str] = ()) -> TextFilter:
    """The filter for the lab's own samples: the deny-list alone."""
    return TextFilter(None, _compiled(deny_patterns), tuple(deny_strings))


def _compiled(deny_patterns: Iterable[str]) -> tuple[re.Pattern[str], ...]:
    """The patterns, matched without regard to case (the text they read is folded: `hacfed.textfold`)."""
    return tuple(re.compile(p, re.IGNORECASE) for p in deny_patterns)


def filter_pool(pool: Sequence[Trajectory], learner: str, flt: TextFilter | None) -> tuple[tuple[Trajectory, ...], int]:
    """(the pool without every peer group, per prompt and source, that holds a sample `flt` refuses,
    how many samples that left out). The learner's own samples always stay; None: no filter."""
    if flt is None:
        return tuple(pool), 0
    refused = {(t.prompt_id, t.source_id) for t in pool if t.source_id != learner and flt.why_not(t) is not None}
    kept = tuple(t for t in pool if (t.prompt_id, t.source_id) not in refused)
    return kept, len(pool) - len(kept)


def withhold_groups(samples: Sequence[Trajectory], flt: TextFilter | None) -> tuple[tuple[Trajectory, ...], int]:
    """(the lab's own samples without every prompt's group that holds a sample `flt` refuses, how many
    samples that withheld); None: no filter."""
    if flt is None:
        return tuple(samples), 0
    refused = {t.prompt_id for t in samples if flt.why_not(t) is not None}
    kept = tuple(t for t in samples if t.prompt_id not in refused)
    return kept, len(samples) - len(kept)


def check_task_solutions(flt: TextFilter, task: Any, problems: int = 8) -> None:
    """ValueError, in one line, when `flt` refuses the reference solution of one of the task's first
    training problems (as a success): a deny pattern that would leave out honest answers."""
    for problem in list(task.train_problems())[:problems]:
        probe = Trajectory("probe", problem.prompt_id, "probe", 0, problem.messages, problem.solution, 1.0, 0.0, 0,
                           "stop")
        reason = flt.why_not(probe)
        if reason is not None:
            raise ValueError(f"the text filter refuses the reference solution of {problem.prompt_id} "
                             f"({reason}): loosen deny_patterns / deny_strings or set inbound_filter = false")


def filters_for(cfg: Any, task: Any) -> tuple[TextFilter | None, TextFilter | None]:
    """(inbound, outbound) filters of a lab's ParticipantConfig `cfg` (None where switched off); the
    inbound one is first checked against the task's reference solutions (`check_task_solutions`)."""
    inbound_filter = inbound(task, cfg.deny_patterns, cfg.deny_strings) if cfg.inbound_filter else None
    if inbound_filter is not None:
        check_task_solutions(inbound_filter, task)
    return inbound_filter, outbound(cfg.deny_patterns, cfg.deny_strings) if cfg.outbound_filter else None
