"""Which lab a node is, as the round driver sees it: an unregistered key is never sent anything, a
hello or a submission signed with another lab's key is refused. Driven like
tests/unit/test_server_driver.py, with direct calls and real participant services."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from hacfed.envelope import DOMAIN_SUBMIT, open_envelope, save_public_key, seal
from hacfed.exchange import open_lab_reply, seal_lab_reply
from hacfed.keys import ensure_key_pair
from hacfed.wire import PayloadType
from tests.unit.test_coordinator_fakes import FakeClock
from tests.unit.test_server_driver import Federation


def test_unknown_key_is_refused_and_never_sent_anything(tmp_path: Path) -> None:
    fed = Federation(tmp_path, FakeClock(), expected_participants=1)
    fed.add(1, "lab-a")
    stranger = fed.add(2, "stranger", register=False)
    fed.run()
    assert stranger.participant.updates == []
    assert fed.driver.journal.participant("stranger") is None
    assert any("REFUSED node 2 as participant stranger: not registered (HACFED-E-UNKNOWN-PARTICIPANT)" in line
               for line in fed.lines)


def test_hello_signed_with_another_participants_key_is_refused(tmp_path: Path) -> None:
    fed = Federation(tmp_path, FakeClock(), expected_participants=2, min_participants=1)
    fed.add(1, "lab-a")
    fed.add(2, "lab-b")
    mallory = fed.add(3, "mallory", signer="lab-b", register=False)  # says mallory, holds lab-b's key
    save_public_key(ensure_key_pair(tmp_path / "mallory-own", "participant").load().public_key(),
                    fed.keys_dir / "mallory.pub")  # mallory is registered, with a key of its own
    fed.exchange()
    assert 3 not in fed.mapped and mallory.participant.updates == []
    assert any(line.startswith("REFUSED node 3 as participant mallory: its hello is not signed with the registered "
                               "key of mallory") for line in fed.lines)


def test_submission_signed_with_another_participants_key_is_an_identity_mismatch(tmp_path: Path) -> None:
    fed = Federation(tmp_path, FakeClock(), expected_participants=2, min_participants=1)
    fed.add(1, "lab-a")
    fed.add(2, "lab-b")
    mallory = fed.add(3, "mallory")
    fed.identified()
    assert fed.mapped[3] == "mallory"  # its hello was its own: it is mallory...
    mallory._key = ensure_key_pair(tmp_path / "lab-b", "participant").load()  # ...then it signs as lab-b
    fed.exchange()
    refused = [line for line in fed.lines if "mallory: REFUSED HACFED-E-IDENTITY-MISMATCH" in line]
    assert refused and "signed with the key of lab-b" in refused[0]
    with sqlite3.connect(fed.driver.cfg.journal_path) as db:
        codes = [row[0] for row in db.execute("SELECT participant_id || ' ' || code FROM rejections")]
    assert codes == ["mallory HACFED-E-IDENTITY-MISMATCH"]
    assert not fed.driver.coordinator.has_submitted("mallory", 0)


def _resigned(fed: Federation, reply: bytes, reply_signer: str, submission_signer: str) -> bytes:
    """`reply` with its submission envelope signed by `submission_signer`'s key and the reply
    around it by `reply_signer`'s (each key as `Federation.add` made it)."""
    keys = fed.driver.membership.keys()
    lab_reply, _ = open_lab_reply(reply, keys)
    body, _ = open_envelope(lab_reply.submission, keys, DOMAIN_SUBMIT, PayloadType.SUBMISSION)
    key_of = {pid: ensure_key_pair(fed.tmp / pid, "participant").load() for pid in (reply_signer, submission_signer)}
    submission = seal(body, PayloadType.SUBMISSION, key_of[submission_signer], DOMAIN_SUBMIT)
    return seal_lab_reply(submission, lab_reply.resends, key_of[reply_signer])


@pytest.mark.parametrize(("reply_signer", "submission_signer"),
                         [("lab-b", "mallory"), ("mallory", "lab-b"), ("mallory", "mallory")])
def test_each_signature_must_be_the_sending_labs_own(tmp_path: Path, reply_signer: str,
                                                     submission_signer: str) -> None:
    """Each of the two checks in server/replies.py holds on its own: a reply signed with another
    lab's key around mallory's own submission (the reply's check), and mallory's own reply around a
    submission that claims mallory but is signed with lab-b's key (the submission's check: the
    coordinator's claimed-id check cannot see it). Either is an IDENTITY-MISMATCH; nothing is recorded.
    Both signed by mallory (the control): accepted."""
    fed = Federation(tmp_path, FakeClock(), expected_participants=2, min_participants=1)
    fed.add(2, "lab-b")
    fed.add(3, "mallory")
    payloads = fed.driver.next_round(fed.identified()) or {}
    assert set(payloads) == {2, 3}
    reply = fed.nodes[3][1].handle(payloads[3])
    fed.driver.on_replies([(3, _resigned(fed, reply, reply_signer, submission_signer))])
    refused = [line for line in fed.lines if "mallory: REFUSED HACFED-E-IDENTITY-MISMATCH" in line]
    if reply_signer == submission_signer == "mallory":
        assert not refused and fed.driver.coordinator.has_submitted("mallory", 0), fed.lines
        return
    assert refused and "signed with the key of lab-b, sent by the node of mallory" in refused[0], fed.lines
    assert not fed.driver.coordinator.has_submitted("mallory", 0)
    assert fed.driver.journal.count("submissions") == 0
