"""The next round's pool comes from the samples kept at intake exactly when they are the journal's
(`KeptSamples.pool`): the same trajectories, field for field and type for type, in the same
order as `Journal.pool`; after a restart, a purge, or a sample whose types the journal would change,
the journal is read instead."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hacfed.server.coordinator import Coordinator, Journal
from hacfed.wire import decode_submission, encode_round_update
from tests.unit.test_coordinator_fakes import FakeClock, make_coordinator, scripted_submission, scripted_trajectories

LABS = ("c", "a", "b")  # submitted in this order: the pool is sorted by participant, not by arrival


def _round_submitted(tmp_path: Path) -> Coordinator:
    coord = make_coordinator(tmp_path, rounds=3, expected_participants=3, min_participants=1, max_strikes=99)
    for pid in LABS:
        coord.register(pid)
    plan = coord.open_round(0)
    coord.submit(scripted_submission(plan, "c"))
    coord.submit(scripted_submission(plan, "a", falsify=1))  # one group rejected: not in the pool
    coord.submit(scripted_submission(plan, "b"))
    coord.close_round("quorum")
    coord.open_round(1)
    return coord


def _fields(pool):
    return [(dataclasses.asdict(t), [type(v) for v in dataclasses.astuple(t)]) for t in pool]


def test_the_pool_kept_at_intake_is_the_journals_pool_and_skips_the_read_back(tmp_path: Path, monkeypatch) -> None:
    coord = _round_submitted(tmp_path)
    journaled = coord.journal.pool(0)
    assert len(journaled) == 3 * 2 * 3 - 3  # a's falsified group is out

    def no_read_back(round_id: int):
        raise AssertionError("the pool was read back from the journal")

    monkeypatch.setattr(coord.journal, "pool", no_read_back)
    update = coord.engine.round_update(1)
    assert update.pool == journaled and _fields(update.pool) == _fields(journaled)
    assert [t.source_id for t in update.pool] == sorted(t.source_id for t in update.pool)
    monkeypatch.undo()
    # Byte for byte what the lab would have been sent from the journal's pool.
    assert encode_round_update(update) == encode_round_update(dataclasses.replace(update, pool=journaled))


def test_after_a_restart_the_pool_is_read_from_the_journal(tmp_path: Path) -> None:
    coord = _round_submitted(tmp_path)
    expected = coord.journal.pool(0)
    restarted = Coordinator(coord.cfg, coord.task, Journal(coord.cfg.journal_path), clock=FakeClock())
    calls = []
    original = restarted.journal.pool
    restarted.journal.pool = lambda r: calls.append(r) or original(r)
    assert restarted.engine.round_update(1).pool == expected and calls == [0]


def test_a_purge_after_intake_is_honoured(tmp_path: Path) -> None:
    coord = _round_submitted(tmp_path)
    coord.journal.purge("b", 0, 0.0, "withdrawn after the round closed")
    pool = coord.engine.round_update(1).pool
    assert pool and "b" not in {t.source_id for t in pool}
    assert pool == coord.journal.pool(0)


@pytest.mark.parametrize("change", [{"source_logp_sum": -0.0}, {"source_logp_sum": -3}])
def test_a_sample_the_journal_would_store_differently_sends_the_journals_pool(tmp_path: Path, change) -> None:
    coord = make_coordinator(tmp_path, rounds=2, expected_participants=1, min_participants=1)
    coord.register("a")
    plan = coord.open_round(0)
    odd = [dataclasses.replace(t, **change) if i == 0 else t
           for i, t in enumerate(scripted_trajectories(plan, "a"))]
    if change["source_logp_sum"] == -0.0:
        odd[0] = dataclasses.replace(odd[0], source_token_count=0)
    result = coord.submit(scripted_submission(plan, "a", trajectories=odd))
    assert odd[0].trajectory_id in result.accepted_ids
    coord.close_round("quorum")
    coord.open_round(1)
    pool = coord.engine.round_update(1).pool
    journaled = coord.journal.pool(0)
    assert _fields(pool) == _fields(journaled)
    assert encode_round_update(coord.engine.round_update(1)) == encode_round_update(
        dataclasses.replace(coord.engine.round_update(1), pool=journaled))


def test_only_the_latest_rounds_are_kept(tmp_path: Path) -> None:
    coord = make_coordinator(tmp_path, rounds=4, expected_participants=1, min_participants=1)
    coord.register("a")
    for round_id in range(3):
        plan = coord.open_round(round_id)
        coord.submit(scripted_submission(plan, "a"))
        coord.close_round("quorum")
    assert coord.kept.rounds() <= {1, 2}  # rounds 0.. were never published here: dropped, not kept


def test_the_rewards_scored_at_close_are_the_journals(tmp_path: Path, monkeypatch) -> None:
    coord = make_coordinator(tmp_path, rounds=3, expected_participants=3, min_participants=1, max_strikes=99)
    for pid in LABS:
        coord.register(pid)
    plan = coord.open_round(0)
    for pid, falsify in zip(LABS, (0, 1, 0)):
        coord.submit(scripted_submission(plan, pid, falsify=falsify))
    expected = coord.journal.accepted_rewards(0)
    monkeypatch.setattr(coord.journal, "accepted_rewards", lambda r: pytest.fail("read back from the journal"))
    assert coord.kept.accepted_rewards(0) == expected and [type(r) for _, r in expected] == [float] * len(expected)
    closed = coord.close_round("quorum")
    assert closed.accepted == len(expected)


def test_the_rewards_after_a_purge_come_from_the_journal(tmp_path: Path) -> None:
    coord = make_coordinator(tmp_path, rounds=3, expected_participants=3, min_participants=1)
    for pid in LABS:
        coord.register(pid)
    plan = coord.open_round(0)
    for pid in LABS:
        coord.submit(scripted_submission(plan, pid))
    coord.journal.purge("a", 0, 0.0, "withdrawn")
    assert coord.kept.accepted_rewards(0) == coord.journal.accepted_rewards(0)
    assert "a" not in {pid for pid, _ in coord.kept.accepted_rewards(0)}


def test_with_the_submitted_bytes_the_pool_is_forwarded_not_encoded_again(tmp_path: Path) -> None:
    """`submit(..., encoded=...)` (the Flower driver's path) keeps each accepted sample's record cut
    from the lab's bytes; `take_pool_records` gives them aligned with the published pool, and they are
    the pool's own encoding. A sample whose verified reward replaced its claim is not the submitted
    object any more: the pool then has no records and is encoded as before."""
    from hacfed.wire import encode_submission
    from hacfed.wire.pool_splice import encode_pool_items

    coord = make_coordinator(tmp_path, rounds=3, expected_participants=3, min_participants=1, max_strikes=99)
    for pid in LABS:
        coord.register(pid)
    plan = coord.open_round(0)
    for pid in LABS:
        sub = scripted_submission(plan, pid, falsify=1 if pid == "a" else 0)
        body = encode_submission(sub)
        coord.submit(decode_submission(body), encoded=body)
    coord.close_round("quorum")
    coord.open_round(1)
    update = coord.engine.round_update(1)
    records = coord.take_pool_records(0)
    assert records is not None and len(records) == len(update.pool) == 3 * 2 * 3 - 3
    assert records == encode_pool_items(update.pool)
    assert coord.take_pool_records(0) is None  # handed over once: the updates keep them
    assert coord.take_pool_records(1) is None  # not published yet

    other = make_coordinator(tmp_path / "claims", rounds=2, expected_participants=1, min_participants=1)
    other.register("a")
    plan = other.open_round(0)
    near = [dataclasses.replace(t, reward=t.reward - 1e-12) if i == 0 and t.reward == 1.0 else t
            for i, t in enumerate(scripted_trajectories(plan, "a"))]
    sub = scripted_submission(plan, "a", trajectories=near)
    body = encode_submission(sub)
    other.submit(decode_submission(body), encoded=body)
    other.close_round("quorum")
    other.open_round(1)
    pool = other.engine.round_update(1).pool
    assert len(pool) == len(near) and other.take_pool_records(0) is None


def test_without_bytes_the_pool_has_no_records(tmp_path: Path) -> None:
    coord = _round_submitted(tmp_path)
    assert coord.engine.round_update(1).pool and coord.take_pool_records(0) is None
