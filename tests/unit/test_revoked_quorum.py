"""After `hacfed-server revoke lab-b`, rounds stop waiting for lab-b: the next round closes at quorum
with the labs that are left (it used to wait its whole deadline, every round, saying nothing), and an
open round says every 30 s whom it still waits for."""

from __future__ import annotations

from pathlib import Path

from hacfed.server.registry import revoke
from hacfed.server.round_waiting import WAITING_LINE_S
from tests.unit.test_coordinator_fakes import FakeClock
from tests.unit.test_server_driver import Federation


def _labs(tmp_path: Path, n: int, **overrides) -> Federation:
    fed = Federation(tmp_path, FakeClock(), rounds=4, expected_participants=n, **overrides)
    for node in range(1, n + 1):
        fed.add(node, f"lab-{chr(ord('a') + node - 1)}")
    assert set(fed.exchange().values()) == {"reply"}  # round 0, everyone in
    return fed


def _close_reason(fed: Federation, round_id: int) -> str | None:
    return fed.driver.coordinator.round_record(round_id).close_reason


def test_after_a_revocation_the_next_round_closes_at_quorum_in_a_two_lab_run(tmp_path):
    fed = _labs(tmp_path, 2, min_participants=1)
    revoke(fed.keys_dir, "lab-b")
    before = fed.clock.t
    fed.exchange()  # round 1 opens, lab-a answers; lab-b is sent nothing
    assert fed.driver.coordinator.current_round is None, "round 1 still waits for the revoked lab-b"
    assert _close_reason(fed, 1) == "quorum" and fed.clock.t == before
    fed.exchange()
    assert _close_reason(fed, 2) == "quorum"


def test_a_revoked_lab_no_longer_counts_towards_the_expected_labs(tmp_path):
    fed = _labs(tmp_path, 3, min_participants=2)
    revoke(fed.keys_dir, "lab-c")
    fed.exchange()
    assert _close_reason(fed, 1) == "quorum"  # lab-a and lab-b: all the labs that are left
    assert fed.driver.coordinator.awaited() == {"lab-a", "lab-b"}


def test_an_open_round_says_whom_it_waits_for_every_30_s(tmp_path):
    fed = _labs(tmp_path, 3, min_participants=2)
    payloads = fed.driver.next_round(fed.identified())  # round 1 to all three
    for node, payload in payloads.items():
        if node == 2:  # lab-b is down
            fed.driver.on_error(node, "UNAVAILABLE")
        else:
            fed.driver.on_replies([(node, fed.nodes[node][1].handle(payload))])
    fed.driver.close_round()
    assert fed.driver.coordinator.current_round == 1
    fed.lines.clear()
    fed.clock.t += WAITING_LINE_S - 1
    fed.driver.next_round(fed.identified())
    assert not any("waiting for" in line for line in fed.lines)
    fed.clock.t += 2
    fed.driver.next_round(fed.identified())
    waiting = [line for line in fed.lines if "waiting for" in line]
    deadline_in = fed.driver.coordinator.round_record(1).deadline - fed.clock.t
    assert waiting == [f"round 1 waiting for lab-b (2 of 3 replied; deadline in {deadline_in:.0f}s)"], fed.lines
