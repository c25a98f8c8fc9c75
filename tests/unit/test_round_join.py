"""round_join "newest" (docs/staleness.md, "Joining the newest round"): a lab that finished its step
joins the newest round, so a fast lab does not wait for a slow one, which skips rounds. The event order
worked by hand, the bound under random speeds, the coordinator and the paced transport with scripted
labs, and the settings. Torch-free: tests/unit/test_staleness_sim.py runs real labs."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from hacfed.messages import ROUND_JOINS
from hacfed.server.coordinator.transport import run_paced
from hacfed.tools.cli import main
from hacfed.tools.experiments.runner import plan_runs
from hacfed.tools.sim import SimConfig
from hacfed.tools.sim_paced import check_round_join
from tests.unit.paced_events import paced_events
from tests.unit.test_bench_modes import _matrix
from tests.unit.test_coordinator_fakes import ScriptedLab, make_config, make_coordinator, scripted_submission

ROOT = Path(__file__).resolve().parents[2]


def order_join_events(compute, speeds, k, rounds):
    return paced_events(compute, speeds, k, rounds, round_join="newest")


def order_events(compute, speeds, k):
    return paced_events(compute, speeds, k, len(next(iter(compute.values()))) - 1)


def _by(events, kind, lab):
    return [(e.step, e.time) for e in events if e.kind == kind and e.lab == lab]


# -- the schedule ------------------------------------------------------------------------------------


def test_at_1_to_4_with_k3_the_fast_lab_never_idles_and_the_slow_one_skips_rounds_worked_by_hand():
    # a: 1 s a step; b: 1 s at factor 4. 12 rounds and each lab's final update, K = 3.
    events = order_join_events({"a": 1.0, "b": 1.0}, {"b": 4.0}, 3, 12)
    # a rolls out every round, one a second, and its final update (step 12) right after round 11.
    assert _by(events, "start", "a") == [(t, float(t)) for t in range(13)]
    # b takes round 0, then at each of its finishes the round a opens at that instant: 4, 8; then its final.
    assert _by(events, "start", "b") == [(0, 0.0), (4, 4.0), (8, 8.0), (12, 12.0)]
    assert [e.own_step for e in events if e.kind == "start" and e.lab == "b"] == [0, 1, 2, 3]
    assert [e.own_step for e in events if e.kind == "start" and e.lab == "a"] == list(range(13))
    # At t = 4 b's round-0 submission arrives, rounds 0-2 close, a opens round 4 and b joins it.
    at4 = [(e.kind, e.lab, e.step) for e in events if e.time == 4]
    assert at4 == [("finish", "a", 3), ("finish", "b", 0), ("start", "a", 4), ("start", "b", 4)]


def test_at_1_to_4_with_k1_the_fast_lab_waits_for_the_bound():
    events = order_join_events({"a": 1.0, "b": 1.0}, {"b": 4.0}, 1, 6)
    # a opens round 2 only once round 0 closed (b's finish at 4), round 3 once round 1 closed (at 4)...
    assert _by(events, "start", "a") == [(0, 0.0), (1, 1.0), (2, 4.0), (3, 5.0), (4, 8.0), (5, 9.0), (6, 12.0)]
    assert _by(events, "start", "b") == [(0, 0.0), (2, 4.0), (4, 8.0), (6, 12.0)]


def test_k0_joining_the_newest_round_is_the_synchronous_schedule():
    compute = {"a": [1.0, 2.0, 1.0, 3.0], "b": [1.0, 1.0, 2.0, 1.0]}
    sync = order_events(compute, {"b": 4.0}, 0)
    joined = order_join_events(compute, {"b": 4.0}, 0, 3)
    assert [(e.time, e.kind, e.lab, e.step) for e in joined] == [(e.time, e.kind, e.lab, e.step) for e in sync]


@pytest.mark.parametrize("seed", range(20))
def test_random_speeds_keep_the_bound_and_every_lab_ends_with_its_final_update(seed):
    rng = random.Random(seed)
    labs = [f"lab{i}" for i in range(rng.randint(1, 4))]
    rounds = rng.randint(1, 10)
    k = min(rng.randint(0, 3), rounds - 1)  # K < rounds (the coordinator's bound)
    compute = {lab: [rng.uniform(0.1, 3.0) for _ in range(rounds + 1)] for lab in labs}
    speeds = {lab: rng.choice([1.0, 2.0, 4.0, 0.5]) for lab in labs}
    events = order_join_events(compute, speeds, k, rounds)
    assert [e.time for e in events] == sorted(e.time for e in events)
    opened: dict[int, float] = {}
    finished: dict[tuple[str, int], float] = {}
    for e in events:
        if e.kind == "start" and e.step < rounds:
            opened.setdefault(e.step, e.time)
        if e.kind == "finish":
            finished[(e.lab, e.step)] = e.time
    assert sorted(opened) == list(range(rounds))  # every round opened, in order
    assert [opened[r] for r in range(rounds)] == sorted(opened.values())
    for lab in labs:
        taken = _by(events, "start", lab)
        steps = [s for s, _ in taken]
        assert steps == sorted(set(steps)) and steps[-1] == rounds  # each round once, in order, then the final
        for (step, start), (prev, _) in zip(taken[1:], taken):
            assert start >= finished[(lab, prev)]  # one step at a time
            waits = step - 1 if step == rounds else step - 1 - k
            if waits >= 0:  # round step - 1 - K had every submission of its takers in
                assert all(start >= t for (other, r), t in finished.items() if r == waits), (lab, step)


def test_bad_join_input_names_the_value():
    with pytest.raises(ValueError, match="round_join must be one of 'every', 'newest', got 'sometimes'"):
        check_round_join("sometimes")
    with pytest.raises(ValueError, match="its step 1 needs one more"):
        order_join_events({"a": [1.0]}, {}, 0, 3)


# -- the coordinator and the paced transport ------------------------------------------------------------


def _joined_run(tmp_path, rounds=12, k=3, eval_every=2):
    labs = [ScriptedLab("a"), ScriptedLab("b")]
    coord = make_coordinator(tmp_path, rounds=rounds, min_participants=2, max_staleness=k, round_join="newest",
                             eval_every=eval_every)
    outcomes, records = run_paced(coord, labs, {"b": 4.0}, lambda lab, update, sub: 1.0)
    return coord, labs, outcomes, records


def test_a_paced_run_joining_the_newest_round_frees_the_fast_lab(tmp_path):
    coord, (a, b), outcomes, records = _joined_run(tmp_path)
    assert [o.round_id for o in outcomes] == list(range(12))
    assert all(o.closed.reason == "quorum" and not o.closed.below_quorum for o in outcomes)
    assert sorted(s for (lab, s) in records if lab == "b") == [0, 4, 8, 12]
    assert all(records[("a", t)].idle == 0 for t in range(13))  # the fast lab never waits
    assert [records[("b", s)].own_step for s in (0, 4, 8, 12)] == [0, 1, 2, 3]
    # A round waits for the labs that took it: b's rounds have both labs' samples, the others a's only.
    for r in range(12):
        assert coord.journal.submitter_ids(r) == ({"a", "b"} if r % 4 == 0 else {"a"}), r
    # a is sent every accepted sample exactly once (b sends one round per step), never older than K = 3.
    every = sorted(t.trajectory_id for r in range(12) for t in coord.journal.pool(r))
    assert sorted(t.trajectory_id for u in a.sent for t in u.pool) == every
    assert max(s for rec in records.values() for s in rec.staleness) == 3
    # b's own samples are 3 rounds old by index (it rolled out round 0, then joins round 4), yet of its
    # current policy; a gets b's round-0 samples at its step 4 (staleness 3), b gets a's round 3 (fresh).
    assert records[("b", 4)].staleness == (3,) * 6 + (0,) * 6 and records[("a", 4)].staleness.count(3) == 6
    assert [coord.journal.round(r).state for r in range(12)] == ["PUBLISHED"] * 12


def _rounds_of(update, source):
    return sorted({int(t.trajectory_id.split("/")[1]) for t in update.pool if t.source_id == source})


def test_the_slow_lab_is_sent_one_round_of_each_peer_per_step_and_never_the_skipped_ones(tmp_path):
    coord, (a, b), _, records = _joined_run(tmp_path)
    # Worked by hand (K = 3, 6 samples a round a lab): b's steps roll out rounds 0, 4, 8 and the final
    # update 12; at each, a's rounds of the window are all in, and b is sent only a's newest of them.
    assert [(_rounds_of(u, "b"), _rounds_of(u, "a")) for u in b.sent] == [([], []), ([0], [3]), ([4], [7]), ([8], [11])]
    assert [records[("b", s)].skipped for s in (0, 4, 8, 12)] == [0, 18, 18, 18]  # a's rounds 0-2, 4-6, 8-10
    assert [len(u.pool) for u in b.sent[1:]] == [12] * 3  # a synchronous step's size: own round + one of a's
    # Never sent later: of a's samples b gets rounds 3, 7 and 11 only, each once.
    b_got = [t.trajectory_id for u in b.sent for t in u.pool if t.source_id == "a"]
    assert len(b_got) == len(set(b_got)) == 18
    # a is sent every round of b (one per step anyway) and skips nothing.
    assert sorted(r for u in a.sent for r in _rounds_of(u, "b")) == [0, 4, 8]
    assert all(rec.skipped == 0 for (lab, _), rec in records.items() if lab == "a")
    rows = {lab: records[(lab, 4)].metrics() for lab in ("a", "b")}
    assert rows["b"]["sim/skipped_samples"] == 18.0 and rows["a"]["sim/skipped_samples"] == 0.0
    assert rows["b"]["sim/trained_samples"] == 12.0


# The chain pair's step costs in bench/staleness.toml's synchronous runs, in simulated seconds at speed
# 1: the rollout of one round, and training on one round of one lab's samples (docs/staleness.md).
CHAIN_ROLLOUT_S, CHAIN_TRAIN_S = 6.55, 18.4


def _chain_cost(lab, update, submission):
    """The simulated cost of a step that trains on `update`'s pool (6 scripted samples a lab a round)."""
    return (CHAIN_ROLLOUT_S if update.next_plan is not None else 0.0) + CHAIN_TRAIN_S * len(update.pool) / 6


def _modelled(tmp_path, k, rounds, **kw):
    """(the fast lab's end time, its idle share) of a paced run of scripted labs at the chain pair's costs."""
    coord = make_coordinator(tmp_path, rounds=rounds, min_participants=2, max_staleness=k, **kw)
    _, records = run_paced(coord, [ScriptedLab("a"), ScriptedLab("b")], {"b": 4.0}, _chain_cost)
    fast = [r for (lab, _), r in records.items() if lab == "a"]
    end = max(r.finish for r in fast)
    return end, sum(r.idle for r in fast) / end


def test_at_the_chain_pairs_costs_the_bench_setting_frees_the_fast_lab(tmp_path):
    """The cost model behind bench/staleness.toml's speed4-join: the fast lab's K + 1 steps (one of
    them with the slow lab's round) take about one slow step, so at that K it barely waits, and its
    run ends near half the synchronous run's time."""
    from hacfed.tools.experiments.matrix import load_matrix

    matrix = load_matrix(ROOT / "bench" / "staleness.toml")
    join, sync = matrix.setting("speed4-join").run, matrix.setting("speed4-k0").run
    sync_end, sync_idle = _modelled(tmp_path / "sync", 0, sync.rounds)
    assert sync_idle > 0.7  # the synchronous fast lab waits about three quarters of its time
    end, idle = _modelled(tmp_path / "join", join.max_staleness, join.rounds, round_join="newest")
    assert idle < 0.12 and 0.4 < end / sync_end < 0.52, (idle, end / sync_end)
    # One K less, the fast lab waits a fifth of its time: the bench's K is the smallest that frees it.
    _, idle_less = _modelled(tmp_path / "less", join.max_staleness - 1, join.rounds, round_join="newest")
    assert idle_less > 0.15, idle_less


def test_a_lab_that_took_no_part_in_a_round_keeps_its_capability_history(tmp_path):
    coord, *_ = _joined_run(tmp_path)
    for r in range(12):  # as for a lab without a submission (down, deadline): no entry for it that round
        history = coord.journal.round(r).tracker_state["history"]
        assert len(history["a"]) == min(r + 1, 5) and len(history["b"]) == min(r // 4 + 1, 5), r
        if r % 4:
            assert coord.journal.round(r).capabilities["b"] == coord.journal.round(r - r % 4).capabilities["b"]


def test_each_lab_evaluates_every_eval_every_of_its_own_steps(tmp_path):
    _, (a, b), _, _ = _joined_run(tmp_path, eval_every=2)
    asked = {lab.participant_id: [u.next_plan.round_id for u in lab.sent if u.next_plan and u.next_plan.evaluate]
             for lab in (a, b)}
    assert asked == {"a": [0, 2, 4, 6, 8, 10], "b": [0, 8]}  # b's own steps 0 and 2 are rounds 0 and 8
    assert all(u.next_plan is None for u in (a.sent[-1], b.sent[-1]))  # the final update (evaluates anyway)


def test_the_joined_rows_are_the_labs_that_took_each_round_with_their_own_step(tmp_path):
    from hacfed.tools.sim_paced import run_paced_sim

    coord = make_coordinator(tmp_path, rounds=8, min_participants=2, max_staleness=3, round_join="newest")
    rows: list[dict] = []

    def rows_of(outcome):
        return [{"round": outcome.round_id, "agent": m.participant_id} for m in outcome.summary.participants]

    records = run_paced_sim(coord, [ScriptedLab("a"), ScriptedLab("b")], {"b": 4.0}, rows_of, rows.append)
    for lab in ("a", "b"):  # a row for each round the lab took, none for the others
        mine = [r for r in rows if r["agent"] == lab]
        assert [r["round"] for r in mine] == sorted(s for (pid, s) in records if pid == lab and s < 8)
        assert [r["sim/own_step"] for r in mine] == list(range(len(mine)))
    assert len([r for r in rows if r["agent"] == "b"]) < 8 == len([r for r in rows if r["agent"] == "a"])


@pytest.mark.parametrize("join", ["every", "newest"])
def test_a_round_only_one_lab_took_waits_for_it_alone_when_joining_the_newest(tmp_path, join):
    coord = make_coordinator(tmp_path, rounds=3, min_participants=1, max_staleness=1, round_join=join)
    coord.register("a")
    coord.register("b")
    p0 = coord.open_round(0)
    coord.engine.update_for("a", 0)  # only a took round 0 (its sending is journaled)...
    coord.submit(scripted_submission(p0, "a"))
    assert coord.poll() is None  # ...but b may still take it
    coord.open_round(1)  # now no lab can: a newer round is open
    if join == "every":  # every lab rolls out every round: round 0 still waits for b
        assert coord.poll() is None
    else:
        assert coord.engine.takers(0) == {"a"}
        assert coord.poll() == "quorum" and not coord.close_round("quorum").below_quorum


# -- settings and the command line ----------------------------------------------------------------------


def test_round_join_is_a_coordinator_setting_that_binds_the_journal_only_when_newest(tmp_path):
    assert make_config(tmp_path).round_join == "every"
    assert "round_join" not in make_config(tmp_path).plan_fingerprint()
    assert make_config(tmp_path, round_join="newest").plan_fingerprint()["round_join"] == "newest"
    with pytest.raises(ValueError, match="round_join must be one of 'every', 'newest', got 'sometimes'"):
        make_config(tmp_path, round_join="sometimes")
    with pytest.raises(ValueError, match="round_join must be one of"):
        SimConfig(round_join="sometimes")
    assert SimConfig(round_join="newest").paced and not SimConfig().paced


def test_cli_refuses_a_bad_round_join_without_traceback(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["sim", "--round-join", "sometimes"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--round-join: invalid choice: 'sometimes'" in err and "Traceback" not in err


def test_the_matrix_key_round_join_reaches_hacfed_sim():
    from hacfed.tools.experiments.matrix import MatrixError

    joined = plan_runs(_matrix({"pair": {"agents": ["m1", "m2"], "max_staleness": 3, "lab_speed": ["m2=4"],
                                         "round_join": "newest"}}))
    assert all(r.sim_args[-2:] == ("--round-join", "newest") for r in joined)
    every = plan_runs(_matrix({"pair": {"agents": ["m1", "m2"], "max_staleness": 3}}))
    assert all("--round-join" not in r.sim_args for r in every)
    with pytest.raises(MatrixError, match=r"\[settings.pair\]: round_join must be one of .*got 'all'"):
        _matrix({"pair": {"agents": ["m1", "m2"], "round_join": "all"}})


def test_the_matrix_and_the_command_line_know_the_coordinators_round_joins():
    from hacfed.tools.experiments import matrix

    assert matrix.ROUND_JOINS == ROUND_JOINS
    with pytest.raises(SystemExit):
        main(["sim", "--round-join", ROUND_JOINS[-1], "--help"])
