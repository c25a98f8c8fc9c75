"""A lab that lies about its rewards, for the tests of the coordinator's re-verification: the real
participant, except that every reward it claims is the opposite of what its verifier gave
(1 - reward). The shipped hacfed-client has no such switch; the lie is wrapped around it here.

In a test's own process, wrap any participant the participant service drives:

    ParticipantService(LyingParticipant(participant), task, key, coordinator_key, state_dir)

As a real process, the hacfed-client command with its own arguments:

    python tests/lying_lab.py --model tiny-llama --server ... --participant-id lab-c ...

which replaces `hacfed.clients.participant.Participant.step` with the lying step before it hands
over to hacfed-client's `main`. Either way the submission the service signs (and keeps in its outbox
for resends) carries the lie, and the lab trains as an honest one would on what it gets back.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Callable

from hacfed.messages import RoundUpdate, Submission

LIE_LINE = "hacfed-client (lying lab, a test double): every reward it claims is the opposite of its verifier's"
Step = Callable[..., Submission]


def falsify_rewards(submission: Submission) -> Submission:
    """The same submission claiming 1 - reward for every sample."""
    flipped = tuple(dataclasses.replace(t, reward=1.0 - t.reward) for t in submission.trajectories)
    return dataclasses.replace(submission, trajectories=flipped)


def lying_step(step: Step) -> Step:
    """`step(participant, update, before_checkpoint)` whose submission (also the one handed to the
    service's before_checkpoint hook, which seals it) claims the opposite rewards."""

    def lie(participant: Any, update: RoundUpdate,
            before_checkpoint: Callable[[Submission], None] | None = None) -> Submission:
        hook = None if before_checkpoint is None else (lambda sub: before_checkpoint(falsify_rewards(sub)))
        return falsify_rewards(step(participant, update, hook))

    return lie


class LyingParticipant:
    """Any participant, lying: `step` as `lying_step`; everything else is the wrapped one's."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def step(self, update: RoundUpdate, before_checkpoint: Callable[[Submission], None] | None = None) -> Submission:
        return lying_step(lambda _, u, hook: self.inner.step(u, hook))(self, update, before_checkpoint)


def main(argv: list[str]) -> int:
    from hacfed.clients.main import main as client_main
    from hacfed.clients.participant import Participant  # torch: only in this process, as in hacfed-client

    Participant.step = lying_step(Participant.step)
    print(LIE_LINE, flush=True)
    return client_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
