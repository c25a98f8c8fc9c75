"""Issue 9's reproductions that had no regression test of their own, each as the review ran it.

docs/security.md maps every reproduction of issue 9 to the test that now fails to reproduce it; most
live next to the code they pin. These are the rest:

- reproduction 5 taken literally: the review deleted `keys/lab-b.pub` by hand (not with
  `hacfed-server revoke`, which tests/unit/test_revocation.py covers), and lab-b's later submissions
  were still accepted;
- security.md S6 at the size it names: 1,000 rollouts of which 10 % claim a false reward, all of those
  rejected and none of an honest lab's (tests/unit/test_coordinator_state.py pins the same rule on a
  handful of samples, with the strikes and the quarantine).
"""

from __future__ import annotations

import dataclasses
import secrets
import sqlite3
from pathlib import Path

from hacfed.server.coordinator import ErrorCode
from tests.unit.test_coordinator_fakes import FakeClock, make_coordinator, scripted_submission
from tests.unit.test_server_driver import Federation


def test_deleting_a_labs_key_file_by_hand_takes_it_out_by_the_next_round(tmp_path: Path) -> None:
    fed = Federation(tmp_path, FakeClock(), rounds=4, expected_participants=2, min_participants=1)
    fed.add(1, "lab-a")
    lab_b = fed.add(2, "lab-b")
    assert fed.exchange() == {1: "reply", 2: "reply"}  # round 0: both labs in
    assert fed.driver.coordinator.has_submitted("lab-b", 0)
    payloads = fed.driver.next_round(fed.identified())
    assert set(payloads) == {1, 2}  # round 1 went out to both ...
    replies = {node: fed.nodes[node][1].handle(payload) for node, payload in payloads.items()}
    (fed.keys_dir / "lab-b.pub").unlink()  # ... then the operator deletes lab-b's key file, as the review did
    for node, reply in replies.items():
        fed.driver.on_replies([(node, reply)])
    fed.driver.close_round()
    assert fed.driver.coordinator.has_submitted("lab-a", 1)
    assert not fed.driver.coordinator.has_submitted("lab-b", 1)  # was: accepted
    assert any(line.startswith("round 1 lab-b: REFUSED HACFED-E-UNAUTHENTICATED") for line in fed.lines), fed.lines
    received = len(lab_b.participant.updates)
    for _ in range(20):  # every later round goes on without lab-b (each closes at its deadline)
        if fed.driver.finished():
            break
        fed.exchange()
        fed.clock.t += 101.0
    assert fed.driver.finished() and len(lab_b.participant.updates) == received
    with sqlite3.connect(fed.driver.cfg.journal_path) as db:
        later = db.execute("SELECT COUNT(*) FROM trajectories WHERE participant_id = 'lab-b' AND round_id >= 1")
        assert later.fetchone()[0] == 0


def test_a_thousand_rollouts_with_ten_percent_false_rewards(tmp_path: Path) -> None:
    """S6: every falsified reward is caught (REWARD_MISMATCH), no honest rollout is refused. Strikes
    are set high here so that all 1,000 rollouts are judged; K strikes quarantine a lab in
    tests/unit/test_coordinator_state.py::test_reward_integrity_strikes_and_quarantine."""
    coord = make_coordinator(tmp_path, FakeClock(), rounds=5, prompts_per_round=25, group_size=8, max_strikes=10**6)
    for pid in ("honest", "cheat"):
        coord.register(pid)
    falsified: set[str] = set()
    honest_refused = caught = judged = 0
    for r in range(5):  # 5 rounds x 25 prompts x G=8 = 1,000 rollouts per lab
        plan = coord.open_round(r)
        honest = coord.submit(scripted_submission(plan, "honest", nonce=secrets.token_hex(16)), sender="honest")
        honest_refused += len(honest.rejected)
        sub = scripted_submission(plan, "cheat", nonce=secrets.token_hex(16))
        trajectories = list(sub.trajectories)
        for i in range(r % 2, len(trajectories), 10):  # every 10th rollout claims the opposite reward
            t = trajectories[i]
            trajectories[i] = dataclasses.replace(t, reward=1.0 - t.reward)
            falsified.add(t.trajectory_id)
        result = coord.submit(dataclasses.replace(sub, trajectories=tuple(trajectories)), sender="cheat")
        judged += len(trajectories)
        mismatched = {x.trajectory_id for x in result.rejected if x.code == ErrorCode.REWARD_MISMATCH}
        caught += len(mismatched)
        assert mismatched == {t.trajectory_id for t in trajectories if t.trajectory_id in falsified}
        assert not set(result.accepted_ids) & falsified
        coord.close_round("quorum")
    assert judged == 1000 and len(falsified) == 100
    assert caught == 100 and honest_refused == 0
