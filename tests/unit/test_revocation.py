"""Revocation takes effect by the next round, while the coordinator runs (issue 9, reproduction 5).

Before, the key directory was re-read only when an unknown id appeared: after `keys/lab-b.pub` was
deleted, lab-b's later submissions were still accepted. Now the driver re-reads the registry before
every round and before it opens any submission; `hacfed-server revoke` is the documented way (the
SuperNode side, unregistering lab-b's Flower node, is tests/unit/test_node_auth.py and the slow
walk-through test).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from hacfed.server.registry import revoke
from tests.unit.test_coordinator_fakes import FakeClock
from tests.unit.test_server_driver import Federation


def _two_labs(tmp_path: Path) -> Federation:
    fed = Federation(tmp_path, FakeClock(), rounds=4, expected_participants=2, min_participants=1)
    fed.add(1, "lab-a")
    fed.add(2, "lab-b")
    assert fed.exchange() == {1: "reply", 2: "reply"}  # round 0, both in
    return fed


def test_a_lab_revoked_mid_round_has_its_next_submission_refused(tmp_path: Path) -> None:
    fed = _two_labs(tmp_path)
    payloads = fed.driver.next_round(fed.identified())
    assert set(payloads) == {1, 2}  # round 1 went out to both...
    replies = {node: fed.nodes[node][1].handle(payload) for node, payload in payloads.items()}
    revoke(fed.keys_dir, "lab-b")  # ...then the operator revokes lab-b, before its reply is read
    for node, reply in replies.items():
        fed.driver.on_replies([(node, reply)])
    fed.driver.close_round()
    assert fed.driver.coordinator.has_submitted("lab-a", 1)
    assert not fed.driver.coordinator.has_submitted("lab-b", 1)
    assert any(line.startswith("round 1 lab-b: REFUSED HACFED-E-UNAUTHENTICATED") for line in fed.lines)
    with sqlite3.connect(fed.driver.cfg.journal_path) as db:
        rows = db.execute("SELECT round_id, code FROM rejections WHERE participant_id = 'lab-b'").fetchall()
    assert rows == [(1, "HACFED-E-UNAUTHENTICATED")]


def test_a_revoked_lab_gets_no_more_rounds_and_no_more_pools(tmp_path: Path) -> None:
    fed = _two_labs(tmp_path)
    lab_b = fed.nodes[2][1].participant
    received = len(lab_b.updates)
    revoke(fed.keys_dir, "lab-b")
    for _ in range(20):  # each round closes at quorum with lab-a alone (tests/unit/test_revoked_quorum.py)
        if fed.driver.finished():
            break
        fed.exchange()
        fed.clock.t += 101.0
    assert fed.driver.finished()
    assert len(lab_b.updates) == received  # nothing after the revocation: no round, no pool, no final update
    assert any(line.startswith("revoked: lab-b is no longer registered") for line in fed.lines)
    later = {t.source_id for r in (1, 2, 3) for t in fed.driver.journal.pool(r)}
    assert later == {"lab-a"}
