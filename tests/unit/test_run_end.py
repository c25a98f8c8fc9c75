"""The end of a run (`hacfed.server.run_end`) with a quarantined lab: it is waited for, and told,
when it is away as the run ends, for at most ACK_GRACE_S, and not at all once revoked. Driven like
tests/unit/test_server_driver.py, with direct calls and real participant services."""

from __future__ import annotations

import json
from pathlib import Path

from hacfed.clients.service import ParticipantService
from hacfed.server.driver_settings import DONE_FILE
from hacfed.server.run_end import ACK_GRACE_S
from tests.unit.test_coordinator_fakes import FakeClock
from tests.unit.test_server_driver import Federation


def _quarantine_and_disconnect_the_cheat(fed: Federation, revoke: bool = False) -> ParticipantService:
    fed.add(1, "honest")
    cheat = fed.add(2, "cheat", cheat=True)
    for _ in range(10):  # until the cheat is quarantined; then its SuperNode loses the coordinator
        fed.exchange()
        if fed.driver.journal.participant("cheat").quarantined:
            break
    assert fed.driver.journal.participant("cheat").quarantined
    del fed.nodes[2], fed.mapped[2]
    if revoke:  # the operator also revokes it (deletes its key file)
        (fed.keys_dir / "cheat.pub").unlink()
    for _ in range(10):  # the honest lab finishes the rounds and gets its ack
        fed.exchange()
        if fed.nodes[1][1].finished:
            break
    assert fed.nodes[1][1].finished
    assert fed.driver.finished() is revoke  # the run waits for a quarantined lab, not for a revoked one
    return cheat


def test_a_quarantined_lab_that_is_away_when_the_run_ends_is_waited_for_and_told(tmp_path: Path) -> None:
    # The CI failure this fixes: the coordinator was restarted while the quarantined lab's SuperNode
    # was in a 25 s reconnect wait; the run ended without it and the lab retried forever.
    clock = FakeClock()
    fed = Federation(tmp_path, clock, max_strikes=3, expected_participants=1)
    cheat = _quarantine_and_disconnect_the_cheat(fed)
    clock.t += 30.0  # the lab's longest reconnect wait; then it is back
    fed.nodes[2] = ("cheat", cheat)
    fed.run()
    assert cheat.finished  # told that the run is over, so hacfed-client exits
    assert len(cheat.participant.updates) == 1  # and still sent no update after its quarantine


def test_a_quarantined_lab_that_stays_away_delays_the_end_by_the_ack_grace_only(tmp_path: Path) -> None:
    clock = FakeClock()
    fed = Federation(tmp_path, clock, max_strikes=3, expected_participants=1, round_deadline_s=600.0)
    cheat = _quarantine_and_disconnect_the_cheat(fed)
    clock.t += ACK_GRACE_S - 1.0
    fed.exchange()
    assert not fed.driver.finished()
    clock.t += 1.0
    fed.exchange()
    assert fed.driver.finished() and not cheat.finished
    done = json.loads((fed.config.state_dir / DONE_FILE).read_text())
    assert done["final_reports"] == ["honest"] and done["missing_final_reports"] == []


def test_a_revoked_quarantined_lab_is_not_waited_for_at_the_end(tmp_path: Path) -> None:
    clock = FakeClock()
    fed = Federation(tmp_path, clock, max_strikes=3, expected_participants=1, round_deadline_s=600.0)
    cheat = _quarantine_and_disconnect_the_cheat(fed, revoke=True)  # finished with no clock advance
    assert not cheat.finished


def test_a_revoked_honest_lab_is_not_waited_for_at_the_end(tmp_path: Path) -> None:
    # The README's walk-through: lab-b is revoked mid-run (never quarantined); the run must end
    # when lab-a is done, not one round deadline later waiting for lab-b's final report.
    clock = FakeClock()
    fed = Federation(tmp_path, clock, expected_participants=2, min_participants=1, round_deadline_s=600.0)
    fed.add(1, "lab-a")
    fed.add(2, "lab-b")
    fed.exchange()
    (fed.keys_dir / "lab-b.pub").unlink()  # revoked
    del fed.nodes[2], fed.mapped[2]
    for _ in range(20):
        fed.exchange()
        if fed.driver.finished():
            break
    assert fed.nodes[1][1].finished and fed.driver.finished()
    done = json.loads((fed.config.state_dir / DONE_FILE).read_text())
    assert done["final_reports"] == ["lab-a"] and done["missing_final_reports"] == []
