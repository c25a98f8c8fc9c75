"""The coordinator across a crash: resuming an open or expired round from the journal, and no
receipt before the submission's commit (R2)."""

from __future__ import annotations

import pytest

from hacfed.server.coordinator import Coordinator, Journal
from tests.unit.test_coordinator_fakes import TASK, FakeClock, make_config, make_coordinator, scripted_submission


@pytest.fixture
def clock():
    return FakeClock()


def test_resume_continues_an_open_round_with_same_id_and_deadline(tmp_path, clock):
    coord = make_coordinator(tmp_path, clock)
    coord.register("a")
    coord.register("b")
    plan = coord.open_round(0)
    receipt = coord.submit(scripted_submission(plan, "a")).receipt
    deadline = coord.round_record(0).deadline
    coord.journal.close()  # "crash"
    clock.t += 10
    revived = Coordinator(make_config(tmp_path), TASK, Journal(make_config(tmp_path).journal_path), clock=clock)
    report = revived.resume()
    assert report.open_round == 0 and report.closed_on_resume is None
    assert revived.round_record(0).deadline == deadline and revived.plan_for(0) == plan
    assert revived.submit(scripted_submission(plan, "a")).receipt == receipt  # client retry: same receipt
    assert revived.submit(scripted_submission(plan, "b")).rejected == ()
    assert revived.poll() == "quorum" and revived.close_round("quorum").accepted == 12


def test_resume_closes_an_expired_round_and_restores_the_tracker(tmp_path, clock):
    coord = make_coordinator(tmp_path, clock)
    coord.register("a")
    coord.register("b")
    coord.submit(scripted_submission(coord.open_round(0), "a"))
    caps0 = coord.close_round("quorum").capabilities
    coord.submit(scripted_submission(coord.open_round(1), "b", falsify=1))
    coord.journal.close()
    clock.t += 1000  # down past the deadline
    cfg = make_config(tmp_path)
    revived = Coordinator(cfg, TASK, Journal(cfg.journal_path), clock=clock)
    assert revived.capabilities() == caps0  # restored from round 0's close
    report = revived.resume()
    assert report.open_round is None and report.next_round == 2
    assert report.closed_on_resume.round_id == 1 and report.closed_on_resume.reason == "deadline"
    assert report.closed_on_resume.accepted == 3  # b's honest group only
    assert revived.capabilities() == pytest.approx({"a": 1 / 3, "b": 1 / 6})  # b's refused group counts 0
    assert revived.resume().closed_on_resume is None  # a second resume changes nothing
    assert revived.journal.count("trajectories") == 9


def test_no_receipt_before_the_commit(tmp_path, clock):
    """R2: submit returns a receipt only after record_submission returned; if the commit fails,
    the caller gets the error and no receipt."""
    calls: list[str] = []

    class LoggingJournal(Journal):
        fail = False

        def record_submission(self, record, result_for_seq):
            calls.append("record:start")
            if self.fail:
                raise OSError("fsync failed")
            seq = super().record_submission(record, result_for_seq)
            calls.append("record:committed")
            return seq

    cfg = make_config(tmp_path)
    journal = LoggingJournal(cfg.journal_path)
    coord = Coordinator(cfg, TASK, journal, clock=clock)
    coord.register("a")
    coord.register("b")
    plan = coord.open_round(0)
    result = coord.submit(scripted_submission(plan, "a"))
    calls.append("ack")
    assert calls == ["record:start", "record:committed", "ack"] and result.receipt.seq == 1
    journal.fail = True
    with pytest.raises(OSError):
        coord.submit(scripted_submission(plan, "b"))
    assert journal.submission_seq("b", 0) is None
