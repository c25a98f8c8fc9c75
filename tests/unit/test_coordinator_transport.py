"""The in-process transport: run_rounds with scripted participants, fake clock, crash and resume."""

from __future__ import annotations

import pytest

from hacfed.server.coordinator import Coordinator, ErrorCode, Journal, ParticipantEndpoint, run_rounds
from hacfed.server.coordinator.pool_share import PoolShares, share_salt
from tests.unit.test_coordinator_fakes import TASK, FakeClock, ScriptedEndpoint, make_config, make_coordinator


class Crash(BaseException):
    """Stands for the coordinator process dying (not an ordinary participant error)."""


class CrashingEndpoint(ScriptedEndpoint):
    def __init__(self, participant_id: str, crash_in_round: int) -> None:
        super().__init__(participant_id)
        self.crash_in_round = crash_in_round

    def exchange(self, update):
        if update.next_plan is not None and update.next_plan.round_id == self.crash_in_round:
            raise Crash()
        return super().exchange(update)


def test_honest_and_cheating_participants_over_three_rounds(tmp_path):
    clock = FakeClock()
    coord = make_coordinator(tmp_path, clock, rounds=3, max_strikes=5)
    honest, cheat = ScriptedEndpoint("honest"), ScriptedEndpoint("cheat", "cheat", falsify=1)
    assert isinstance(honest, ParticipantEndpoint)
    seen = []
    outcomes = run_rounds(coord, [honest, cheat], on_round=seen.append, sleep=clock.sleep)
    assert [o.round_id for o in outcomes] == [0, 1, 2] and seen == outcomes
    assert clock.sleeps == []  # every round closed by quorum: nobody waited for a deadline
    for outcome in outcomes:
        assert outcome.closed.reason == "quorum"
        assert outcome.results["honest"].rejected == ()
        codes = [r.code for r in outcome.results["cheat"].rejected]
        assert codes.count(ErrorCode.REWARD_MISMATCH) == 1 and codes.count(ErrorCode.GROUP_REJECTED) == 2
    assert coord.journal.participant("cheat").strikes == 3
    # each update carries the previous round's verified pool and the next plan
    updates = honest.updates
    assert [u.pool_round for u in updates] == [None, 0, 1, 2]
    assert [u.next_plan.round_id if u.next_plan else None for u in updates] == [0, 1, 2, None]
    for u in updates[1:]:
        assert sorted({t.source_id for t in u.pool}) == ["cheat", "honest"]
        assert len(u.pool) == 6 + 3  # honest: 2 groups of 3; cheat: its honest group only
        assert all(t.reward == TASK.verify(TASK.problem(t.prompt_id), t.response_text).reward for t in u.pool)
    # the cheater's refused group counts as 3 zeros: 1 right of 6 assigned
    assert updates[1].capabilities == pytest.approx({"honest": 1 / 3, "cheat": 1 / 6})
    assert cheat.updates[1].pool == updates[1].pool  # everyone gets the same pool
    # the final update's report is kept as round 3's metrics
    final = coord.round_summary(2).participants
    assert {m.participant_id for m in final} == {"cheat", "honest"}
    assert coord.journal.round_stats(3)["honest"]["report"]["eval_accuracy"] == 0.9
    assert run_rounds(coord, [honest, cheat], sleep=clock.sleep) == []  # finished: nothing more to do


def test_beyond_k_plus_one_labs_each_is_sent_its_own_samples_and_k_peers_per_prompt(tmp_path):
    """`hacfed sim` sends each lab the pool share a Flower coordinator sends (pool_share, K peers per
    prompt), not the whole pool: with 4 labs and K = 1, every lab's update holds, per prompt, its own
    group and one other lab's, the selection the driver's salt draws, and nothing else differs."""
    clock = FakeClock()
    coord = make_coordinator(tmp_path, clock, rounds=3, prompts_per_round=6, expected_participants=4,
                             pool_peers_per_prompt=1)
    endpoints = [ScriptedEndpoint(f"lab-{i}") for i in range(4)]
    run_rounds(coord, endpoints, sleep=clock.sleep)
    peers_seen: set[str] = set()
    for ep in endpoints:
        assert [u.pool_round for u in ep.updates] == [None, 0, 1, 2]
        for u in ep.updates[1:]:
            round_id = u.next_plan.round_id if u.next_plan else coord.cfg.rounds  # the final update's: rounds
            whole = coord.engine.round_update(round_id)
            assert u.capabilities == whole.capabilities and u.next_plan == whole.next_plan
            expected = PoolShares(whole.pool, 1, share_salt(coord.cfg.run_id, coord.cfg.seed, round_id))
            assert u.pool == tuple(whole.pool[i] for i in expected.indices_for(ep.participant_id))
            groups: dict[str, set[str]] = {}
            for t in u.pool:
                groups.setdefault(t.prompt_id, set()).add(t.source_id)
            assert len(groups) == 6 and all(ep.participant_id in g and len(g) == 2 for g in groups.values())
            peers_seen |= {s for g in groups.values() for s in g} - {ep.participant_id}
    assert peers_seen == {f"lab-{i}" for i in range(4)}  # the offsets spread over every source


def test_at_most_k_plus_one_labs_all_get_the_same_whole_pool(tmp_path):
    clock = FakeClock()
    coord = make_coordinator(tmp_path, clock, rounds=2, expected_participants=3, pool_peers_per_prompt=2)
    endpoints = [ScriptedEndpoint(f"lab-{i}") for i in range(3)]
    run_rounds(coord, endpoints, sleep=clock.sleep)
    for ep in endpoints[1:]:
        assert ep.updates[1].pool == endpoints[0].updates[1].pool == coord.engine.round_update(1).pool


def test_failing_and_absent_participants_do_not_stall_a_round(tmp_path):
    clock = FakeClock()
    coord = make_coordinator(tmp_path, clock, rounds=2, expected_participants=3, min_participants=1)
    endpoints = [ScriptedEndpoint("ok"), ScriptedEndpoint("boom", "raise"), ScriptedEndpoint("gone", "absent")]
    outcomes = run_rounds(coord, endpoints, sleep=clock.sleep)
    assert [o.closed.reason for o in outcomes] == ["deadline", "deadline"]
    assert clock.sleeps == [pytest.approx(100.0)] * 2  # waited exactly until each deadline
    first = outcomes[0]
    assert first.failures == {"boom": "RuntimeError: boom crashed", "gone": "no submission"}
    assert first.results["ok"].rejected == () and first.closed.contributors == ("ok",)
    assert not first.closed.below_quorum


def test_below_quorum_round_is_extended_once_then_closed(tmp_path):
    clock = FakeClock()
    coord = make_coordinator(tmp_path, clock, rounds=1, expected_participants=2, min_participants=2)
    outcomes = run_rounds(coord, [ScriptedEndpoint("ok"), ScriptedEndpoint("gone", "absent")], sleep=clock.sleep)
    assert clock.sleeps == [pytest.approx(100.0), pytest.approx(100.0)]  # deadline, then one extension
    assert outcomes[0].closed.below_quorum and outcomes[0].summary.below_quorum


def test_crash_mid_round_then_resume_counts_nothing_twice(tmp_path):
    clock = FakeClock()
    cfg = make_config(tmp_path, rounds=3)
    coord = Coordinator(cfg, TASK, Journal(cfg.journal_path), clock=clock)
    a, b = ScriptedEndpoint("a"), CrashingEndpoint("b", crash_in_round=1)
    with pytest.raises(Crash):
        run_rounds(coord, [a, b], sleep=clock.sleep)
    assert coord.current_round == 1 and coord.has_submitted("a", 1) and not coord.has_submitted("b", 1)
    deadline = coord.round_record(1).deadline
    coord.journal.close()  # the process is gone

    clock.t += 10  # restarted before the deadline
    revived = Coordinator(cfg, TASK, Journal(cfg.journal_path), clock=clock)
    b_again = ScriptedEndpoint("b")
    outcomes = run_rounds(revived, [a, b_again], sleep=clock.sleep)
    assert [o.round_id for o in outcomes] == [1, 2]  # round 1 continued, not re-opened
    assert revived.round_record(1).deadline == deadline and outcomes[0].closed.reason == "quorum"
    assert "a" not in outcomes[0].results  # a had already answered round 1: not asked again
    assert [u.next_plan.round_id for u in a.updates if u.next_plan] == [0, 1, 2]
    assert revived.journal.count("trajectories") == 3 * 2 * 6  # 3 rounds x 2 participants x 6, once each
    assert revived.journal.count("rounds") == 3 and revived.journal.pragma("integrity_check") == "ok"


def test_resume_after_the_deadline_closes_with_what_was_accepted(tmp_path):
    clock = FakeClock()
    cfg = make_config(tmp_path, rounds=3)
    coord = Coordinator(cfg, TASK, Journal(cfg.journal_path), clock=clock)
    with pytest.raises(Crash):
        run_rounds(coord, [ScriptedEndpoint("a"), CrashingEndpoint("b", crash_in_round=1)], sleep=clock.sleep)
    coord.journal.close()
    clock.t += 10_000  # down for longer than the deadline
    revived = Coordinator(cfg, TASK, Journal(cfg.journal_path), clock=clock)
    outcomes = run_rounds(revived, [ScriptedEndpoint("a"), ScriptedEndpoint("b")], sleep=clock.sleep)
    assert [o.round_id for o in outcomes] == [2]
    round1 = revived.round_record(1)
    assert round1.close_reason == "deadline" and revived.journal.submitters(1) == {"a": 6}
    assert revived.journal.count("trajectories") == 6 * 2 + 6 + 6 * 2


def test_duplicate_endpoint_ids_are_refused(tmp_path):
    coord = make_coordinator(tmp_path)
    with pytest.raises(ValueError, match="unique"):
        run_rounds(coord, [ScriptedEndpoint("a"), ScriptedEndpoint("a")])
