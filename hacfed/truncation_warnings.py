"""The warning that a lab's responses are mostly cut at the response budget.

Torch-free (the coordinator's dashboard shows it): printed by `hacfed sim` and `hacfed-client`
(`TruncationWarnings`), shown on the coordinator's dashboard (`truncation_warning`). The fraction is
each step's `rollout_truncated_frac` (`StepReport.metrics`, in every metrics row).
"""

from __future__ import annotations

# Above this fraction of responses cut at the budget, a lab's rewards mostly score unfinished
# answers: the console says so once per lab, and again each time the fraction has grown by
# TRUNCATION_WORSEN_STEP since it last said so (rollout_truncated_frac in every row).
TRUNCATION_WARN_FRAC = 0.10
TRUNCATION_WORSEN_STEP = 0.10


def truncation_warning(agent: str, truncated_frac: float, setting: str, before: float | None = None) -> str:
    """The warning that `agent`'s responses were cut at the budget; `before`: the fraction of its
    previous warning (said with this one). Printed by `hacfed sim` and `hacfed-client`, shown on the
    coordinator's dashboard."""
    worse = "" if before is None else f" (up from {before:.0%})"
    return (f"warning: {agent}: {truncated_frac:.0%} of its responses were cut at the response budget{worse} "
            f"(finish reason 'length'); their rewards score unfinished answers: raise {setting}")


class TruncationWarnings:
    """The console warnings of `truncation_warning`: once per lab whose `rollout_truncated_frac` first
    goes above TRUNCATION_WARN_FRAC, again when it has grown by TRUNCATION_WORSEN_STEP since;
    `setting` names what to raise (e.g. "--max-new-tokens")."""

    def __init__(self, setting: str) -> None:
        self.setting = setting
        self.warned: dict[str, float] = {}  # lab -> the fraction its last warning said

    def check(self, agent: str, truncated_frac: float | None) -> str | None:
        """The warning for this row, or None (at or below the threshold, unknown, or not worse than
        the last warning by TRUNCATION_WORSEN_STEP)."""
        if truncated_frac is None or truncated_frac <= TRUNCATION_WARN_FRAC:
            return None
        before = self.warned.get(agent)
        if before is not None and truncated_frac < before + TRUNCATION_WORSEN_STEP - 1e-9:
            return None
        self.warned[agent] = truncated_frac
        return truncation_warning(agent, truncated_frac, self.setting, before)
