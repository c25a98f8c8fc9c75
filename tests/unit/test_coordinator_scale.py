"""The coordinator scale bench's core at a tiny size (bench/coordinator_scale.py).

2 labs x 20 trajectories x 2 rounds through the real round driver, journal and GSM8K verifier: the
journal must hold exactly the trajectories the labs submitted, and the reported numbers must be
consistent with each other (no assertion on how fast anything is).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import sqlite3
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "coordinator_scale.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("coordinator_scale", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def test_tiny_run_journals_exactly_the_submitted_trajectories_and_sane_numbers(bench, tmp_path: Path) -> None:
    import hacfed.envelope
    import hacfed.server.replies as replies
    from hacfed.wire import MAX_MESSAGE_BYTES

    original_decode = replies.decode_submission
    cfg = bench.ScaleConfig(labs=2, prompts=5, group_size=4, rounds=2, correct_fraction=0.4, nonplain_fraction=0.2)
    point = bench.run_point(cfg, tmp_path / "run", isolate=False)

    from coordinator_scale_labs import submitted_ids  # the bench's own module, found next to it

    submitted = submitted_ids(tmp_path / "run", cfg)
    assert len(submitted) == len(set(submitted)) == 2 * 20 * 2
    assert point["journal_ids_sha"] == hashlib.sha256("\n".join(submitted).encode("utf-8")).hexdigest()
    assert point["journal_counts"] == {"submissions": 4, "trajectories": 80, "rejections": 0, "strikes": 0}
    assert point["sandbox_calls"] > 0  # some answers went to math-verify, the rest took the numeric fast path

    total = point["round_total_s"]
    assert total > 0 and point["round_cpu_s"] > 0
    assert all(v >= 0 for v in point["phases_s"].values()) and set(point["phases_s"]) == set(bench.PHASES)
    assert point["phases_s"]["decode"] > 0 and point["phases_s"]["reward"] > 0 and point["phases_s"]["journal"] > 0
    assert point["phases_s"]["pool"] > 0  # round 1 built and signed round 0's pool
    assert sum(point["phases_s"].values()) == pytest.approx(total, rel=0.05, abs=0.01)  # exclusive times add up
    assert point["us_per_trajectory"] == pytest.approx(total / 40 * 1e6)
    assert 0 < point["update_mib"] * 2**20 < MAX_MESSAGE_BYTES and not point["update_over_cap"]
    assert point["rss_peak_mib"] >= point["rss_baseline_mib"] > 0
    assert point["reference_s"] > 0 and point["round_per_reference"] == pytest.approx(total / point["reference_s"])
    assert "round/ref" in bench.table([point])

    # the bench's timers and its lifted size cap are gone once it returns
    assert replies.decode_submission is original_decode
    assert hacfed.envelope.seal.__kwdefaults__["max_bytes"] == MAX_MESSAGE_BYTES

    double = dict(point, config=dict(point["config"], labs=4), round_total_s=2 * total,
                  us_per_trajectory=point["us_per_trajectory"], rss_growth_mib_per_lab=point["rss_growth_mib_per_lab"])
    (ratio,) = bench.growth([point, double])
    assert ratio["labs_ratio"] == 2 and ratio["time_ratio"] == pytest.approx(2)
    assert ratio["us_per_trajectory_ratio"] == 1


def test_bad_sizes_are_refused_with_the_name_of_the_setting(bench) -> None:
    with pytest.raises(ValueError, match="ScaleConfig.labs"):
        bench.ScaleConfig(labs=0)
    with pytest.raises(ValueError, match="ScaleConfig.rounds"):
        bench.ScaleConfig(labs=2, rounds=1)
    assert bench.main(["--labs", "4,x"]) == 2


# ---- the coordinator hot spots the bench found: same results, less work -----------------------------

OLD_SUBMITTERS = ("SELECT s.participant_id, COUNT(t.trajectory_id) FROM submissions s "
                  "LEFT JOIN trajectories t ON t.submission_seq = s.seq WHERE s.round_id=? GROUP BY s.participant_id")


def _two_rounds(tmp_path: Path):
    """A journal with two closed rounds: an honest lab, a cheat whose falsified groups are rejected,
    a lab with nothing accepted (every sample a wrong reward), then a purge of the cheat's round 1."""
    from tests.unit.test_coordinator_fakes import make_coordinator, scripted_submission, scripted_trajectories

    coord = make_coordinator(tmp_path, rounds=2, expected_participants=3, min_participants=1, max_strikes=99)
    for pid in ("a", "b", "c"):
        coord.register(pid)
    for round_id in range(2):
        plan = coord.open_round(round_id)
        coord.submit(scripted_submission(plan, "a"))
        coord.submit(scripted_submission(plan, "b", falsify=1))
        lies = [dataclasses.replace(t, reward=1.0 - t.reward) for t in scripted_trajectories(plan, "c")]
        coord.submit(scripted_submission(plan, "c", trajectories=lies))
        coord.close_round("quorum")
    coord.journal.purge("b", 1, 0.0, "test")
    return coord


def test_submitters_counts_as_the_join_over_every_trajectory_did(tmp_path: Path) -> None:
    coord = _two_rounds(tmp_path)
    for round_id in (0, 1, 2):
        old = {r[0]: int(r[1]) for r in coord.journal._db.execute(OLD_SUBMITTERS, (round_id,))}
        assert coord.journal.submitters(round_id) == old
    assert coord.journal.submitters(0) == {"a": 6, "b": 3, "c": 0}  # b lost the falsified group, c everything
    statements: list[str] = []
    coord.journal._db.set_trace_callback(statements.append)
    coord.journal.submitters(1)
    coord.journal._db.set_trace_callback(None)
    plan = [r[-1] for r in coord.journal._db.execute("EXPLAIN QUERY PLAN " + statements[-1])]
    # through the round index, not a temporary index built over every trajectory of the run
    assert any("trajectories_round" in step for step in plan), plan
    assert not any(step.startswith("SEARCH t USING AUTOMATIC") for step in plan), plan


def test_pool_rows_share_each_prompt_and_equal_fresh_parses(tmp_path: Path) -> None:
    from tests.unit.test_coordinator_fakes import trajectory_of_row

    coord = _two_rounds(tmp_path)
    pool = coord.journal.pool(0)
    coord.journal._db.row_factory = sqlite3.Row
    rows = coord.journal._db.execute(
        "SELECT * FROM trajectory_rows WHERE round_id=0 AND purged=0 "
        "ORDER BY participant_id, prompt_pos, idx").fetchall()
    assert pool == tuple(trajectory_of_row(r) for r in rows) and len(pool) == 9
    assert len({id(t.prompt) for t in pool}) == len({t.prompt_id for t in pool}) == 2  # one tuple per prompt
    assert [t.source_id for t in coord.journal.pool(1)] == ["a"] * 6  # the purge still applies


def test_trajectory_rows_name_their_prompt_stored_as_before() -> None:
    """Schema 3 stores a prompt once, as the JSON schema 2 wrote in every row, and a row names it."""
    import json

    from hacfed.server.coordinator.journal_schema import prompt_json, trajectory_row
    from hacfed.server.coordinator.plan import make_plan
    from hacfed.server.coordinator.validation import AcceptedTrajectory
    from tests.unit.test_coordinator_fakes import TASK, make_config, scripted_trajectories

    plan = make_plan(make_config(Path("unused")), TASK, 0)
    accepted = [AcceptedTrajectory(t, t.reward, i // 3, i % 3) for i, t in enumerate(scripted_trajectories(plan, "a"))]
    for a in accepted:
        assert prompt_json(a.trajectory.prompt) == json.dumps([m.as_dict() for m in a.trajectory.prompt],
                                                              ensure_ascii=False)
        row = trajectory_row(7, 0, a, 42)
        assert row[7] == 42 and row[:7] == (a.trajectory.trajectory_id, 7, "a", 0, a.trajectory.prompt_id,
                                            a.prompt_pos, a.idx)


def test_an_accepted_claim_is_kept_only_when_it_already_is_the_verified_float() -> None:
    from hacfed.server.coordinator.validation import _with_reward
    from hacfed.trajectory import ChatMessage, Trajectory

    t = Trajectory("t", "p", "a", 0, (ChatMessage("user", "q"),), "1", 1.0, -1.0, 1, "stop")
    assert _with_reward(t, 1.0) is t
    for claim, verified in ((1, 1.0), (-0.0, 0.0), (0.9999999, 1.0)):
        out = _with_reward(dataclasses.replace(t, reward=claim), verified)
        assert type(out.reward) is float and repr(out.reward) == repr(verified)
        assert out == dataclasses.replace(t, reward=verified)


def test_the_coordinator_keeps_only_the_latest_pool_in_memory(tmp_path: Path) -> None:
    coord = _two_rounds(tmp_path)
    first = coord.engine.round_update(1)
    assert len(first.pool) == 9 and first.pool_round == 0
    coord.engine.round_update(2)
    assert coord.kept.pool_rounds() == [1]
    assert coord.engine.round_update(1).pool == first.pool  # an older pool is read back from the journal
