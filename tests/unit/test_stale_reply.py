"""A lab's node that answers round r with its round r-1 reply (issue 31; security.md S3): handled as the
identical resend it is, and reported as what it is on the console and in the round's step times."""

from __future__ import annotations

from pathlib import Path

from tests.unit.test_coordinator_fakes import FakeClock
from tests.unit.test_server_driver import Federation


def test_a_node_answering_a_round_with_its_previous_reply_is_not_counted_as_this_rounds(tmp_path: Path) -> None:
    """A lab's node answers round 1 with its round-0 reply (the same bytes again): the submission is
    an identical resend of round 0 (its receipt again, nothing recorded twice), and the console names
    it as round 0's, sent as the reply to round 1, not as round 1's submission; its old report's step
    times are not taken as round 1's."""
    clock = FakeClock()
    fed = Federation(tmp_path, clock, expected_participants=1)
    service = fed.add(1, "lab-a")
    payloads = fed.driver.next_round(fed.identified()) or {}
    old_reply = service.handle(payloads[1])
    fed.driver.on_replies([(1, old_reply)])
    fed.driver.close_round()  # round 0 closed by quorum
    assert fed.driver.next_round(fed.identified()) and fed.driver.coordinator.current_round == 1
    fed.lines.clear()
    fed.driver.on_replies([(1, old_reply)])
    assert fed.driver.journal.count("submissions") == 1 and not fed.driver.coordinator.has_submitted("lab-a", 1)
    line = next(line for line in fed.lines if "lab-a: submitted" in line)
    assert line.startswith("round 0 (sent as the reply to round 1) lab-a: submitted") and "identical resend" in line
    assert not any(line.startswith("round 1 lab-a") for line in fed.lines), fed.lines
    assert fed.driver.report.steps_of(1) == {}  # round 1's step times are not round 0's report
    fed.run()  # the lab is asked again and answers round 1 itself
    assert fed.driver.coordinator.finished and fed.driver.journal.count("submissions") >= 2
