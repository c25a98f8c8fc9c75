"""The round state machine: gates, idempotency, strikes and quarantine, closing rules, capability
updates, publishing, ACK ordering, metrics, and the torch-free import."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hacfed.server.coordinator import Coordinator, CoordinatorStateError, ErrorCode, Journal, append_jsonl
from tests.unit.test_coordinator_fakes import (
    TASK,
    FakeClock,
    make_config,
    make_coordinator,
    replace_at,
    scripted_submission,
    scripted_trajectories,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def coord(tmp_path, clock):
    c = make_coordinator(tmp_path, clock)
    c.register("a")
    c.register("b")
    return c


def counts(c: Coordinator) -> dict[str, int]:
    return {t: c.journal.count(t) for t in ("submissions", "trajectories", "rejections", "strikes")}


def test_honest_submission_is_acked_durably_and_resends_are_idempotent(coord):
    plan = coord.open_round(0)
    sub = scripted_submission(plan, "a", eval_accuracy=0.4)
    first = coord.submit(sub)
    assert first.rejected == () and len(first.accepted_ids) == 6 and first.receipt.seq == 1
    before = counts(coord)
    again = coord.submit(scripted_submission(plan, "a", eval_accuracy=0.4))  # identical content
    assert again.replayed and again == first and again.receipt.to_json() == first.receipt.to_json()
    assert counts(coord) == before
    # a different payload for the same round is a duplicate, and nothing is added
    other = scripted_submission(plan, "a", trajectories=scripted_trajectories(plan, "a", tag="x"))
    assert coord.submit(other).refusal == ErrorCode.DUPLICATE
    assert counts(coord)["trajectories"] == before["trajectories"]


def test_nonce_reuse_with_a_different_payload_is_refused(coord):
    plan = coord.open_round(0)
    coord.submit(scripted_submission(plan, "a", nonce="0" * 32))
    coord.close_round("deadline")
    plan1 = coord.open_round(1)
    assert coord.submit(scripted_submission(plan1, "a", nonce="0" * 32)).refusal == ErrorCode.NONCE_REUSE
    assert coord.submit(scripted_submission(plan1, "a", nonce="1" * 32)).rejected == ()


def test_an_in_process_submission_the_wire_cannot_carry_is_refused_whole(coord):
    """A trajectory of types no decoder builds (forced behind the dataclass's back) has no wire
    encoding, so no digest: the submission is refused with SCHEMA, journaled, and nothing is recorded."""
    plan = coord.open_round(0)
    trajectories = scripted_trajectories(plan, "a")
    odd = dataclasses.replace(trajectories[0])
    object.__setattr__(odd, "prompt", "a prompt that is a str")
    result = coord.submit(scripted_submission(plan, "a", trajectories=(odd,) + tuple(trajectories[1:])))
    assert result.receipt is None and result.refusal == ErrorCode.SCHEMA
    assert "cannot be encoded for the wire" in result.rejected[0].detail
    assert counts(coord)["submissions"] == 0 and coord.journal.count("rejections") == 1
    assert coord.submit(scripted_submission(plan, "a")).accepted_ids  # the honest one goes through


def test_submission_gates(coord, tmp_path):
    plan = coord.open_round(0)
    sub = scripted_submission(plan, "a")
    cases = [
        (coord.submit(sub, sender="b"), ErrorCode.IDENTITY_MISMATCH),
        (coord.submit(scripted_submission(plan, "mallory")), ErrorCode.UNKNOWN_PARTICIPANT),
        (coord.submit(dataclasses.replace(sub, run_id="other-run")), ErrorCode.WRONG_RUN),
        (coord.submit(dataclasses.replace(sub, round_id=7)), ErrorCode.UNKNOWN_ROUND),
        (coord.submit("not a submission"), ErrorCode.SCHEMA),  # type: ignore[arg-type]
    ]
    for result, code in cases:
        assert result.receipt is None and result.refusal == code
    assert counts(coord)["submissions"] == 0 and coord.journal.count("rejections") == len(cases)  # audited
    small = make_coordinator(tmp_path / "small", max_submission_bytes=1024)
    small.register("a")
    big = scripted_submission(small.open_round(0), "a", trajectories=replace_at(
        scripted_trajectories(small.plan_for(0), "a"), 1, response_text=" " * 2000))
    assert small.submit(big).refusal == ErrorCode.SIZE


def test_a_gate_refusal_is_journaled_and_audited_under_the_authenticated_sender(tmp_path, clock):
    """S10: b claiming to be a, or sending garbage, is refused on b's own record; a's record stays
    clean (the hostile corpus found such refusals journaled under the claimed id)."""
    from hacfed.server.audit import AuditLog

    cfg = make_config(tmp_path)
    coord = Coordinator(cfg, TASK, Journal(cfg.journal_path, audit=AuditLog(cfg.audit_path, clock=clock)), clock=clock)
    coord.register("a")
    coord.register("b")
    plan = coord.open_round(0)
    claims_a = scripted_submission(plan, "a")
    assert coord.submit(claims_a, sender="b").refusal == ErrorCode.IDENTITY_MISMATCH
    assert coord.submit("not a submission", sender="b").refusal == ErrorCode.SCHEMA  # type: ignore[arg-type]
    assert coord.submit(dataclasses.replace(claims_a, run_id="other-run")).refusal == ErrorCode.WRONG_RUN  # no sender
    with coord.journal._lock:
        query = "SELECT participant_id, code FROM rejections ORDER BY rowid"
        rows = [tuple(r) for r in coord.journal._db.execute(query)]
    assert rows == [("b", ErrorCode.IDENTITY_MISMATCH.value), ("b", ErrorCode.SCHEMA.value),
                    ("a", ErrorCode.WRONG_RUN.value)]  # unauthenticated (in-process): the claimed id
    lines = [json.loads(x) for x in coord.cfg.audit_path.read_text().splitlines()]
    assert [(x["participant"], x["code"]) for x in lines if x["kind"] == "reject"] == rows
    assert coord.submit(claims_a, sender="a").recorded  # a itself is still welcome


def test_late_and_stale_rounds(coord):
    plan0 = coord.open_round(0)
    accepted = coord.submit(scripted_submission(plan0, "a"))
    coord.close_round("deadline")
    rows, summary = counts(coord), coord.round_summary(0)
    late = coord.submit(scripted_submission(plan0, "b"))
    assert late.refusal == ErrorCode.ROUND_CLOSED
    # the closed round is unchanged (R4); the refusal is only an audit row
    assert counts(coord) == {**rows, "rejections": rows["rejections"] + 1}
    assert coord.round_summary(0) == summary
    # an identical resend of what was accepted still gets its original receipt (outbox retries)
    assert coord.submit(scripted_submission(plan0, "a")).receipt == accepted.receipt
    coord.open_round(1)
    coord.close_round("deadline")
    coord.open_round(2)
    assert coord.submit(scripted_submission(plan0, "b")).refusal == ErrorCode.STALE_ROUND


def test_reward_integrity_strikes_and_quarantine(tmp_path, clock):
    coord = make_coordinator(tmp_path, clock, rounds=5, max_strikes=3, strike_window_rounds=3)
    for pid in ("honest", "cheat"):
        coord.register(pid)
    outcomes = {}
    for r, falsify in enumerate((2, 1)):
        plan = coord.open_round(r)
        honest = coord.submit(scripted_submission(plan, "honest"))
        cheat = coord.submit(scripted_submission(plan, "cheat", falsify=falsify))
        outcomes[r] = cheat
        assert honest.rejected == ()  # 0 honest rejected
        mismatches = [x for x in cheat.rejected if x.code == ErrorCode.REWARD_MISMATCH]
        assert len(mismatches) == falsify  # 100 % of falsified rewards caught
        coord.close_round("quorum")
    cheat = coord.journal.participant("cheat")
    assert cheat.strikes == 3 and cheat.quarantined and cheat.quarantined_round == 1
    assert [e["participant_id"] for e in coord.journal.events("quarantine")] == ["cheat"]
    # the quarantining submission's honest group still stands: it passed every check
    assert len(outcomes[1].accepted_ids) == 3
    plan = coord.open_round(2)
    assert coord.submit(scripted_submission(plan, "cheat")).refusal == ErrorCode.QUARANTINED
    assert coord.register("cheat").quarantined  # rejoining does not lift it
    assert "cheat" not in coord.engine.round_update(2).participants


def test_strikes_outside_the_window_do_not_quarantine(tmp_path, clock):
    coord = make_coordinator(tmp_path, clock, rounds=4, max_strikes=3, strike_window_rounds=1)
    coord.register("cheat")
    for r in range(3):
        coord.submit(scripted_submission(coord.open_round(r), "cheat", falsify=2))
        coord.close_round("deadline")
    record = coord.journal.participant("cheat")
    assert record.strikes == 6 and not record.quarantined


def test_close_updates_capabilities_once_with_verified_rewards(coord):
    plan = coord.open_round(0)
    coord.submit(scripted_submission(plan, "a", falsify=1))  # a: one group refused, one accepted 1/3 right
    closed = coord.close_round("quorum")
    assert closed.accepted == 3 and closed.contributors == ("a",)
    # a is scored over all 6 assigned samples: 1 right, the refused group's 3 count as 0 -> 1/6
    assert closed.capabilities == pytest.approx({"a": 1 / 6, "b": 1.0})  # b absent: no history, P̂ = 1
    with pytest.raises(CoordinatorStateError):
        coord.close_round("quorum")  # cannot count the round twice
    assert coord.round_record(0).capabilities == pytest.approx({"a": 1 / 6, "b": 1.0})
    plan1 = coord.open_round(1)
    coord.submit(scripted_submission(plan1, "a"))
    coord.submit(scripted_submission(plan1, "b"))
    # a: window [1/6, 1/3] -> 1/4 ; b: [1/3]
    assert coord.close_round("quorum").capabilities == pytest.approx({"a": 1 / 4, "b": 1 / 3})


def test_ready_to_close_quorum_deadline_and_extension(tmp_path, clock):
    coord = make_coordinator(tmp_path, clock, expected_participants=3, min_participants=2, max_deadline_extensions=1)
    for pid in ("a", "b", "c"):
        coord.register(pid)
    plan = coord.open_round(0)
    deadline = coord.round_record(0).deadline
    coord.submit(scripted_submission(plan, "a"))
    assert coord.poll() is None  # before the deadline, 2 of 3 missing
    clock.t = deadline
    assert coord.ready_to_close() is None and coord.poll() is None  # below quorum: extended once
    extended = coord.round_record(0)
    assert extended.extensions == 1 and extended.deadline == deadline + 100.0
    assert [e["kind"] for e in coord.journal.events()] == ["deadline_extended"]
    coord.submit(scripted_submission(plan, "b"))
    assert coord.poll() is None  # quorum reached, but c might still come until the new deadline
    coord.submit(scripted_submission(plan, "c"))
    assert coord.poll() == "quorum"  # everyone answered: close early
    assert coord.close_round("quorum").below_quorum is False


def test_early_close_waits_for_every_active_participant(tmp_path, clock):
    coord = make_coordinator(tmp_path, clock, expected_participants=2, min_participants=1)
    for pid in ("a", "b"):
        coord.register(pid)
    plan = coord.open_round(0)
    coord.register("late")  # joined after the round opened: the round now waits for it too
    coord.submit(scripted_submission(plan, "a"))
    coord.submit(scripted_submission(plan, "b"))
    assert coord.poll() is None
    coord.submit(scripted_submission(plan, "late"))
    assert coord.poll() == "quorum"


def test_below_quorum_closes_after_the_extensions(tmp_path, clock):
    coord = make_coordinator(tmp_path, clock, expected_participants=2, min_participants=2, max_deadline_extensions=1)
    coord.register("a")
    coord.register("b")
    coord.submit(scripted_submission(coord.open_round(0), "a"))
    clock.t += 100
    assert coord.poll() is None
    clock.t += 100
    assert coord.poll() == "deadline"
    closed = coord.close_round("deadline")
    assert closed.below_quorum and closed.contributors == ("a",)
    assert coord.round_record(0).below_quorum is True


def test_round_update_publishes_verified_pool_and_next_plan(coord):
    coord.open_round(0)
    first = coord.engine.round_update(0)
    assert first.pool_round is None and first.pool == () and first.next_plan == coord.plan_for(0)
    assert first.capabilities == {"a": 1.0, "b": 1.0} and first.participants == ("a", "b")
    coord.submit(scripted_submission(coord.plan_for(0), "a"))
    coord.submit(scripted_submission(coord.plan_for(0), "b", falsify=1))
    with pytest.raises(CoordinatorStateError, match="must be closed"):
        coord.engine.round_update(1)
    coord.close_round("quorum")
    with pytest.raises(CoordinatorStateError, match="open round 1"):
        coord.engine.round_update(1)
    coord.open_round(1)
    update = coord.engine.round_update(1)
    assert update.pool_round == 0 and update.next_plan.round_id == 1 and update.hacpo == coord.cfg.hacpo
    assert [t.source_id for t in update.pool] == ["a"] * 6 + ["b"] * 3  # b's falsified group is not shared
    assert all(t.reward == TASK.verify(TASK.problem(t.prompt_id), t.response_text).reward for t in update.pool)
    assert coord.round_record(0).state == "PUBLISHED"
    coord.close_round("deadline")
    coord.open_round(2)
    coord.close_round("deadline")
    final = coord.engine.round_update(3)
    assert final.next_plan is None and final.pool_round == 2 and coord.finished
    with pytest.raises(CoordinatorStateError):
        coord.open_round(3)


def test_round_order_is_enforced_and_open_is_idempotent(coord):
    with pytest.raises(CoordinatorStateError):
        coord.open_round(1)
    plan = coord.open_round(0)
    assert coord.open_round(0) == plan and coord.open_round() == plan
    with pytest.raises(CoordinatorStateError, match="still open"):
        coord.open_round(1)


def test_register_validates_and_rejoins(coord, clock):
    with pytest.raises(ValueError, match="participant id"):
        coord.register("")
    with pytest.raises(ValueError, match="participant id"):
        coord.register("bad\nid")
    joined = coord.journal.participant("a").joined_at
    clock.t += 50
    again = coord.register("a")
    assert again.joined_at == joined and again.last_seen == clock.t and len(coord.participants()) == 2



def test_round_summary_and_metrics_file(coord, tmp_path):
    plan = coord.open_round(0)
    coord.submit(scripted_submission(plan, "a", eval_accuracy=0.75))
    coord.close_round("deadline")
    summary = coord.round_summary(0)
    a, b = summary.participants
    assert (a.participant_id, a.submitted, a.accepted, a.rejected) == ("a", True, 6, 0)
    assert a.reward_mean == pytest.approx(1 / 3) and a.eval_accuracy == 0.75 and a.train_metrics == {"loss": 0.25}
    assert a.capability == pytest.approx(1 / 3)
    assert (b.submitted, b.reward_mean, b.eval_accuracy) == (False, None, None)
    assert b.capability is None  # nothing measured: not the starting P̂ of 1.00
    assert summary.console_line().startswith("round 0 closed (deadline): a reward 0.33 eval 0.75")
    assert summary.console_line().endswith("| b reward - eval - P - acc 0 rej 0")
    path = tmp_path / "metrics.jsonl"
    append_jsonl(path, summary)
    append_jsonl(path, summary)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 2 and lines[0]["participants"]["a"]["accepted"] == 6 and lines[0]["round"] == 0


def test_coordinator_never_imports_torch(tmp_path):
    script = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        sys.path.insert(0, {str(REPO)!r})
        from hacfed.server.coordinator import load_task_from_config
        from tests.unit.test_coordinator_fakes import make_config, make_coordinator, scripted_submission
        task = load_task_from_config(make_config(Path({str(tmp_path)!r})))  # the server's real path
        coord = make_coordinator(Path({str(tmp_path)!r}), task=task)
        coord.register("a")
        result = coord.submit(scripted_submission(coord.open_round(0), "a"))
        assert result.receipt is not None
        coord.close_round("deadline")
        coord.open_round(1)
        coord.engine.round_update(1)
        heavy = sorted(m for m in ("torch", "transformers", "vllm") if m in sys.modules)
        assert not heavy, heavy
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
