"""Under max_staleness K >= 1 a lab may submit only for a round the journal shows as sent to it
(security.md N4: lab-a's round-1 submission was accepted before its own round 0).

Over the real journal of the Flower driver (`sent_steps`), with the streaming loop played by hand as
in tests/unit/test_stale_driver.py.
"""

from __future__ import annotations

from pathlib import Path

from hacfed.server.coordinator import Coordinator
from hacfed.server.coordinator.errors import ErrorCode
from hacfed.server.coordinator.journal import Journal
from tests.unit.test_coordinator_fakes import TASK, FakeClock, make_config, scripted_submission
from tests.unit.test_server_driver import Federation
from tests.unit.test_stale_driver import Poller


def test_a_lab_cannot_submit_for_an_open_round_it_was_never_sent(tmp_path: Path) -> None:
    fed = Federation(tmp_path, FakeClock(), rounds=4, max_staleness=1)
    fed.add(1, "lab-a")
    fed.add(2, "lab-b")
    loop = Poller(fed)
    coordinator, journal = fed.driver.coordinator, fed.driver.journal
    loop.poll("lab-a")  # round 0 opens; both labs are sent step 0; only lab-a replies
    loop.poll("lab-a")  # lab-a is sent step 1, which opens round 1
    assert coordinator.open_rounds() == [0, 1]
    assert journal.was_sent("lab-a", 1) and journal.was_sent("lab-b", 0) and not journal.was_sent("lab-b", 1)
    ahead = coordinator.submit(scripted_submission(coordinator.plan_for(1), "lab-b"), sender="lab-b")
    assert [r.code for r in ahead.rejected] == [ErrorCode.UNSENT_ROUND] and ahead.receipt is None
    assert "round 1 was never sent to lab-b" in ahead.rejected[0].detail
    assert journal.submission_seq("lab-b", 1) is None
    for _ in range(30):  # lab-b's own steps are still taken, in order
        if fed.driver.finished():
            break
        loop.poll("lab-a", "lab-b")
    assert fed.driver.finished() and loop.steps("lab-b") == [0, 1, 2, 3, None]
    assert journal.submission_seq("lab-b", 1) is not None


def test_a_coordinator_that_journals_no_sends_does_not_ask_the_journal(tmp_path: Path) -> None:
    # `hacfed sim`'s paced transport sends in process (`engine.update_for`): a lab's exchange is a direct call.
    cfg = make_config(tmp_path, max_staleness=1, expected_participants=2)
    coordinator = Coordinator(cfg, TASK, Journal(cfg.journal_path), clock=FakeClock())
    for pid in ("a", "b"):
        coordinator.register(pid)
    coordinator.open_round(0)
    result = coordinator.submit(scripted_submission(coordinator.open_round(1), "a"))
    assert result.receipt is not None and not result.rejected
