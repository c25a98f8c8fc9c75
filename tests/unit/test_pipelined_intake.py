"""Judging in two halves (issue 11, coordinator scale): the driver begins one lab's submission while
the verifier's workers still decide the one before it, and nothing is answered before its COMMIT.

`Coordinator.begin_submit` runs the gates, the cheap checks and the start of reward verification;
the function it returns waits for the verdicts and journals. `FederationDriver.on_replies` begins
each reply of a pull before it finishes the one before it (bench/coordinator_scale.py measures it).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from hacfed.server.coordinator.errors import ErrorCode
from hacfed.server.coordinator.intake import SubmissionIntake
from hacfed.tasks.base import Verdict
from tests.unit.test_coordinator_fakes import TASK, FakeClock, make_coordinator, scripted_submission
from tests.unit.test_server_driver import Federation


class TwoHalvesTask:
    """The arithmetic task with `start_verify_batch`, logging when each batch starts and when its
    verdicts are collected (by the first response's participant, which scripted samples name)."""

    def __init__(self, log: list[tuple[str, int]]) -> None:
        self.name, self.log = TASK.name, log

    def train_problems(self):
        return TASK.train_problems()

    def problem(self, prompt_id: str):
        return TASK.problem(prompt_id)

    def verify(self, problem, response: str) -> Verdict:
        return TASK.verify(problem, response)

    def start_verify_batch(self, items):
        self.log.append(("start", len(items)))
        verdicts = [TASK.verify(problem, response) for problem, response in items]

        def collect() -> list[Verdict]:
            self.log.append(("collect", len(items)))
            return verdicts

        return collect


def test_a_begun_submission_is_journaled_only_when_finished_and_blocks_its_lab_until_then(tmp_path: Path) -> None:
    log: list[tuple[str, int]] = []
    coord = make_coordinator(tmp_path, task=TwoHalvesTask(log), verify_threads=2, expected_participants=2,
                             prompts_per_round=4, group_size=2)
    coord.register("a")
    coord.register("b")
    plan = coord.open_round(0)
    sub_a, sub_b = scripted_submission(plan, "a", falsify=1), scripted_submission(plan, "b")
    finish_a = coord.begin_submit(sub_a)
    assert log == [("start", 8)] and not coord.has_submitted("a", 0)  # verifying: nothing journaled yet
    again = coord.begin_submit(sub_a)()  # the same lab while its first is judged: refused, not judged twice
    assert again.refusal is not None and again.rejected[0].code is ErrorCode.DUPLICATE
    assert "is being judged" in again.rejected[0].detail and again.rejected[0].retry_after_s == 1.0  # resent later
    finish_b = coord.begin_submit(sub_b)  # another lab: begun while a's verdicts are still out
    assert log == [("start", 8), ("start", 8)]
    result_a = finish_a()
    assert log[-1] == ("collect", 8) and coord.has_submitted("a", 0) and not coord.has_submitted("b", 0)
    assert result_a.receipt is not None and len(result_a.accepted_ids) == 6
    assert [r.code for r in result_a.rejected].count(ErrorCode.REWARD_MISMATCH) == 1
    result_b = finish_b()
    assert result_b.receipt is not None and len(result_b.accepted_ids) == 8
    assert result_b.receipt.seq > result_a.receipt.seq
    assert coord.submit(sub_a).replayed  # finished: an identical resend gets the stored result
    assert coord.poll() == "quorum"


def test_on_replies_begins_each_lab_before_it_finishes_the_one_before(tmp_path: Path, monkeypatch) -> None:
    """Three labs' replies of one pull: b is begun before a is finished, c before b; every one is
    journaled and its receipt queued when `on_replies` returns, and its answer comes only after
    its own finish (R2)."""
    events: list[str] = []
    real = SubmissionIntake.begin_submit

    def begin_submit(self, sub, *args, **kwargs):
        events.append(f"begin {sub.participant_id}")
        finish = real(self, sub, *args, **kwargs)

        def finished():
            result = finish()
            events.append(f"finish {sub.participant_id}")
            return result

        return finished

    monkeypatch.setattr(SubmissionIntake, "begin_submit", begin_submit)
    fed = Federation(tmp_path, FakeClock(), expected_participants=3, min_participants=1)
    for node, pid in ((1, "lab-a"), (2, "lab-b"), (3, "lab-c")):
        fed.add(node, pid)
    payloads = fed.driver.next_round(fed.identified())
    replies = [(node, fed.nodes[node][1].handle(payload)) for node, payload in sorted(payloads.items())]
    receipts = fed.driver.answers.receipt
    monkeypatch.setattr(fed.driver.answers, "receipt", lambda pid, result: (events.append(f"answer {pid}"),
                                                                           receipts(pid, result))[1])
    fed.driver.on_replies(replies)
    assert events == ["begin lab-a", "begin lab-b", "finish lab-a", "answer lab-a", "begin lab-c",
                      "finish lab-b", "answer lab-b", "finish lab-c", "answer lab-c"]
    with sqlite3.connect(fed.driver.cfg.journal_path) as db:
        assert sorted(r[0] for r in db.execute("SELECT participant_id FROM submissions")) == ["lab-a", "lab-b", "lab-c"]
    assert all(fed.driver.answers.pending(pid) for pid in ("lab-a", "lab-b", "lab-c"))
    fed.driver.close_round()
    assert fed.driver.journal.round(0).close_reason == "quorum"



def test_a_reply_carrying_two_submissions_of_one_lab_is_judged_one_after_the_other(tmp_path: Path) -> None:
    """A reply's resends and its submission are one lab's: the driver finishes the first before it
    begins the next, so the second meets the journal with the first in it (here: already submitted
    for the round, not "being judged"), and the lab's answers come in the order of its submissions."""
    from hacfed.exchange import open_answer
    from hacfed.wire import SubmissionReceipt, SubmissionRefusal
    from tests.unit.test_replay_protection import _inject

    fed = Federation(tmp_path, FakeClock(), expected_participants=2, min_participants=1)
    lab_a = fed.add(1, "lab-a")
    fed.add(2, "lab-b")
    payloads = fed.driver.next_round(fed.identified())
    plan = fed.driver.coordinator.plan_for(0)
    resent = _inject(lab_a, scripted_submission(plan, "lab-a", nonce="f" * 32))
    replies = [(node, fed.nodes[node][1].handle(payload)) for node, payload in sorted(payloads.items())]
    fed.driver.on_replies(replies)
    answers = [open_answer(a, lab_a._trusted) for a in fed.driver.answers.pending("lab-a")]
    assert [type(a) for a in answers] == [SubmissionReceipt, SubmissionRefusal], answers
    assert answers[0].nonce == resent and not answers[0].rejections
    assert answers[1].code == ErrorCode.DUPLICATE.value and "already submitted for round 0" in answers[1].message
    assert fed.driver.coordinator.has_submitted("lab-b", 0)


def test_one_signed_submission_three_times_in_a_reply_is_judged_once(tmp_path: Path) -> None:
    """A hostile (or confused) lab repeats one signed submission as its primary and two resends,
    in a pull with another lab: it is judged and journaled once, the repeats get the stored
    receipt, and nothing is left begun."""
    from hacfed.envelope import DOMAIN_SUBMIT, seal
    from hacfed.exchange import open_answer, seal_lab_reply
    from hacfed.wire import PayloadType, SubmissionReceipt, encode_submission

    fed = Federation(tmp_path, FakeClock(), expected_participants=2, min_participants=1)
    lab_a = fed.add(1, "lab-a")
    fed.add(2, "lab-b")
    payloads = fed.driver.next_round(fed.identified())
    plan = fed.driver.coordinator.plan_for(0)
    envelope = seal(encode_submission(scripted_submission(plan, "lab-a", nonce="a" * 32)), PayloadType.SUBMISSION,
                    lab_a._key, DOMAIN_SUBMIT)
    fed.driver.on_replies([(1, seal_lab_reply(envelope, [envelope, envelope], lab_a._key)),
                           (2, fed.nodes[2][1].handle(payloads[2]))])
    answers = [open_answer(a, lab_a._trusted) for a in fed.driver.answers.pending("lab-a")]
    assert answers and all(isinstance(a, SubmissionReceipt) and a.seq == answers[0].seq for a in answers), answers
    with sqlite3.connect(fed.driver.cfg.journal_path) as db:
        assert db.execute("SELECT COUNT(*) FROM submissions WHERE participant_id='lab-a'").fetchone()[0] == 1
        assert db.execute("SELECT COUNT(*) FROM rejections").fetchone()[0] == 0  # no "being judged" refusal
    assert not fed.driver.replies.unfinished and not fed.driver.coordinator.intake.judging
