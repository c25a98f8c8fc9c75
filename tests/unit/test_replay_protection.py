"""S3 (replay / idempotency) with real envelopes through the driver and the labs' services: an
identical resend, in the same round or later, gets the original byte-identical receipt and leaves the
journal unchanged; the same nonce with a new payload is HACFED-E-NONCE-REUSE; another run's envelope
is HACFED-E-WRONG-RUN; an old round's envelope with new content is HACFED-E-STALE-ROUND. Also the
flood of S5 through the driver: resends beyond the rate limit are refused before they are decoded."""

from __future__ import annotations

import dataclasses
import secrets
import sqlite3

from hacfed.envelope import DOMAIN_SUBMIT, seal
from hacfed.exchange import open_answer, seal_lab_reply
from hacfed.server.deliveries import ANSWERS, Sent
from hacfed.wire import PayloadType, SubmissionReceipt, encode_submission
from tests.unit.test_coordinator_fakes import FakeClock, scripted_submission
from tests.unit.test_server_driver import Federation


def _journal_counts(fed) -> dict[str, int]:
    journal = fed.driver.journal
    return {t: journal.count(t) for t in ("submissions", "trajectories")}


def _reopen(service, nonce: str) -> None:
    """Make an answered outbox entry pending again, as if its receipt had been lost."""
    with service.outbox._lock:
        service.outbox._db.execute("UPDATE outbox SET state='pending', answer=NULL WHERE nonce=?", (nonce,))


def _inject(service, submission) -> str:
    """A signed submission in the lab's outbox, resent with its next reply."""
    envelope = seal(encode_submission(submission), PayloadType.SUBMISSION, service._key, DOMAIN_SUBMIT)
    service.outbox.add(("injected", submission.round_id, secrets.randbelow(1 << 30)), submission.round_id,
                       submission.nonce, envelope)
    return submission.nonce


def _answer_for(service, nonce: str):
    entry = service.outbox.by_nonce(nonce)
    return entry, open_answer(entry.answer, service._trusted) if entry.answer else None


def test_identical_resends_get_the_original_receipt_and_replays_are_refused(tmp_path):
    clock = FakeClock()
    fed = Federation(tmp_path, clock, rounds=4, expected_participants=3, min_participants=1,
                     max_deadline_extensions=0)
    lab_a = fed.add(1, "lab-a")
    fed.add(2, "lab-b")
    fed.exchange()  # the first round waits one deadline for the 3 expected labs
    clock.t += 100.0
    fed.exchange()  # round 0 opens with 2; both submit; it stays open (3 expected)
    fed.exchange()  # answers only: both receipts delivered
    [first] = [e for e in lab_a.outbox.entries() if e.round_id == 0]
    assert first.state == "acked"
    receipt = first.answer
    assert isinstance(open_answer(receipt, lab_a._trusted), SubmissionReceipt)
    before = _journal_counts(fed)

    # 1. identical resend in the same round (forced now: the driver would only ask at its next delivery)
    _reopen(lab_a, first.nonce)
    fed.driver.deliveries.record(1, Sent("lab-a", ANSWERS, clock.t))
    fed.driver.on_replies([(1, seal_lab_reply(b"", [first.envelope], lab_a._key))])
    fed.exchange()  # the answer goes back to lab-a
    entry, _ = _answer_for(lab_a, first.nonce)
    assert entry.state == "acked" and entry.answer == receipt  # byte-identical
    assert _journal_counts(fed) == before

    # 2. identical resend in a later round: the lab's outbox resends it with its next reply
    clock.t += 101.0
    fed.exchange()  # round 0 closes at its deadline, round 1 opens
    _reopen(lab_a, first.nonce)
    fed.exchange()  # answers only: round 1's receipts; lab-a's reply resends round 0's submission
    fed.exchange()  # ... and gets its answer back
    entry, _ = _answer_for(lab_a, first.nonce)
    assert entry.answer == receipt
    with sqlite3.connect(fed.driver.cfg.journal_path) as db:
        assert db.execute("SELECT COUNT(*) FROM submissions WHERE round_id=0").fetchone()[0] == 2

    # 3. the same nonce with another payload; 4. another run; 5. an old round with new content
    plan0, plan1 = fed.driver.coordinator.plan_for(0), fed.driver.coordinator.plan_for(1)
    reuse = _inject(lab_a, dataclasses.replace(scripted_submission(plan1, "lab-a", nonce=first.nonce),
                                               created_at_ms=12345))
    other_run = _inject(lab_a, dataclasses.replace(scripted_submission(plan1, "lab-a", nonce=secrets.token_hex(16)),
                                                   run_id="another-run"))
    clock.t += 101.0
    fed.exchange()  # round 1 closes, round 2 opens: round 0 is now an older closed round
    stale = _inject(lab_a, scripted_submission(plan0, "lab-a", nonce=secrets.token_hex(16)))
    counted = _journal_counts(fed)
    for _ in range(3):
        fed.exchange()
    codes = {}
    for nonce in (other_run, stale):
        entry, answer = _answer_for(lab_a, nonce)
        codes[nonce] = (entry.state, answer.code)
    assert codes[other_run] == ("refused", "HACFED-E-WRONG-RUN")
    assert codes[stale] == ("refused", "HACFED-E-STALE-ROUND")
    # the nonce-reuse entry shares its nonce with the original one: its refusal is the notice the lab printed
    assert any("REFUSED HACFED-E-NONCE-REUSE" in n for n in fed.notices["lab-a"])
    assert _journal_counts(fed) == counted  # none of them wrote anything
    del reuse


def test_a_resend_flood_is_refused_before_decoding_and_the_other_lab_goes_on(tmp_path, monkeypatch):
    """A hostile lab answers with a LabReply of 40 signed submissions (10x its burst of 4): the
    driver takes one token per item before it verifies or decodes it; lab-b's reply is judged fully."""
    clock = FakeClock()
    fed = Federation(tmp_path, clock, rounds=2, expected_participants=2, rate_limit_per_s=0.5, rate_limit_burst=4)
    lab_a = fed.add(1, "lab-a")
    fed.add(2, "lab-b")
    decoded: list[int] = []
    import hacfed.server.replies as driver_module

    real_decode = driver_module.decode_submission
    monkeypatch.setattr(driver_module, "decode_submission",
                        lambda body, **kw: decoded.append(1) or real_decode(body, **kw))
    payloads = fed.driver.next_round({1: "lab-a", 2: "lab-b"})  # round 0 opens: an update for each lab
    plan = fed.driver.coordinator.plan_for(0)
    flood = [seal(encode_submission(scripted_submission(plan, "lab-a", nonce=secrets.token_hex(16))),
                  PayloadType.SUBMISSION, lab_a._key, DOMAIN_SUBMIT) for _ in range(40)]
    fed.driver.on_replies([(1, seal_lab_reply(b"", flood, lab_a._key))])
    fed.driver.on_replies([(2, fed.nodes[2][1].handle(payloads[2]))])
    refused = [line for line in fed.lines if "lab-a: REFUSED HACFED-E-RATE-LIMITED" in line]
    assert len(refused) == 36 and "retry in" in refused[0]
    assert len(decoded) == 4 + 1  # lab-a's burst, and lab-b's submission: nothing else was decoded
    assert "round 0 lab-b: submitted 4 trajectories, accepted 4" in "\n".join(fed.lines)
    assert fed.driver.journal.submission_seq("lab-b", 0) is not None
    answers = [open_answer(a, lab_a._trusted) for a in fed.driver.answers.pending("lab-a")]
    limited = [a for a in answers if getattr(a, "code", "") == "HACFED-E-RATE-LIMITED"]
    assert limited and all(a.retry_after_ms > 0 for a in limited)  # answered, with a retry-after (sent once)
