"""Which lab a node is, as the round driver sees it: an unregistered key is never sent anything, a
hello or a submission signed with another lab's key is refused. Driven like
tests/unit/test_server_driver.py, with direct calls and real participant services."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from hacfed.envelope import save_public_key
from hacfed.keys import ensure_key_pair
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
