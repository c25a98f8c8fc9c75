"""Bounded staleness (docs/staleness.md): the event order on the simulated clock (the in-process
transport's, `paced_events`), the coordinator with
up to K + 1 open rounds, what each lab is sent, and the refusals of bad settings. Torch-free: the labs
here are scripted (tests/unit/test_staleness_sim.py runs real ones)."""

from __future__ import annotations

import random

import pytest

from hacfed.server.coordinator import CoordinatorStateError
from hacfed.server.coordinator.transport import check_speeds, run_paced, run_rounds
from hacfed.tools.cli import main
from hacfed.tools.sim import SimConfig
from hacfed.tools.sim_paced import check_max_staleness, parse_lab_speeds
from tests.unit.paced_events import Event, paced_events
from tests.unit.test_coordinator_fakes import FakeClock, ScriptedLab, make_config, make_coordinator, scripted_submission


def _times(events, kind):
    return {(e.lab, e.step): e.time for e in events if e.kind == kind}


def order_events(compute, speeds, k):
    """The events of a paced run where compute[lab][t] is step t's cost, t = 0..R (the final update R)."""
    return paced_events(compute, speeds, k, len(next(iter(compute.values()))) - 1)


# -- the schedule ------------------------------------------------------------------------------------


def test_k0_is_synchronous_every_step_starts_when_the_slowest_lab_finished():
    events = order_events({"a": [1, 1, 1, 1], "b": [1, 1, 1, 1]}, {"b": 4.0}, 0)
    starts = _times(events, "start")
    assert [starts[("a", t)] for t in range(4)] == [0, 4, 8, 12]
    assert [starts[("b", t)] for t in range(4)] == [0, 4, 8, 12]
    assert max(e.time for e in events) == 16


def test_k1_lets_the_fast_lab_run_one_round_ahead_worked_by_hand():
    # a: 1 s a step; b: 1 s at factor 4. Rounds 0-2 and the final update (step 3), K = 1.
    events = order_events({"a": [1, 1, 1, 1], "b": [1, 1, 1, 1]}, {"b": 4.0}, 1)
    starts, finishes = _times(events, "start"), _times(events, "finish")
    assert [starts[("a", t)] for t in range(4)] == [0, 1, 4, 12]  # step 2 waits for round 0, the final for all
    assert [finishes[("a", t)] for t in range(4)] == [1, 2, 5, 13]
    assert [starts[("b", t)] for t in range(4)] == [0, 4, 8, 12]  # the slow lab never waits
    # At t = 4 b's round-0 submission arrives before a (then b, in lab order) starts its next step.
    at4 = [(e.kind, e.lab, e.step) for e in events if e.time == 4]
    assert at4 == [("finish", "b", 0), ("start", "a", 2), ("start", "b", 1)]


def _check_bound(events: list[Event], k: int, labs: list[str], rounds: int) -> None:
    """Every step starts after the lab's previous step finished and after every lab finished the round
    it must wait for (t - 1 - K; all of them for the final update)."""
    starts, finishes = _times(events, "start"), _times(events, "finish")
    for lab in labs:
        for t in range(1, rounds + 1):
            assert starts[(lab, t)] >= finishes[(lab, t - 1)]
            waits = t - 1 if t == rounds else t - 1 - k
            if waits >= 0:
                assert all(starts[(lab, t)] >= finishes[(other, waits)] for other in labs), (lab, t)


@pytest.mark.parametrize("seed", range(20))
def test_random_speeds_never_break_the_bound_and_k0_never_lets_a_lab_ahead(seed):
    rng = random.Random(seed)
    labs = [f"lab{i}" for i in range(rng.randint(1, 4))]
    rounds = rng.randint(1, 6)
    k = min(rng.randint(0, 3), rounds - 1)  # K < rounds (the coordinator's bound)
    compute = {lab: [rng.uniform(0.1, 3.0) for _ in range(rounds + 1)] for lab in labs}
    speeds = {lab: rng.choice([1.0, 2.0, 4.0, 0.5]) for lab in labs}
    events = order_events(compute, speeds, k)
    assert len(events) == 2 * len(labs) * (rounds + 1)
    assert [e.time for e in events] == sorted(e.time for e in events)
    _check_bound(events, k, labs, rounds)
    sync = _times(order_events(compute, speeds, 0), "start")
    assert all(len({sync[(lab, t)] for lab in labs}) == 1 for t in range(rounds + 1))  # K = 0: in step
    # Allowing staleness never makes a lab finish its steps later.
    assert all(_times(events, "finish")[key] <= _times(order_events(compute, speeds, 0), "finish")[key] + 1e-9
               for key in sync)


@pytest.mark.parametrize("call, match", [
    (lambda: check_speeds({"c": 2.0}, ["a", "b"]), "lab speed for unknown agent 'c'; agents: a, b"),
    (lambda: check_speeds({"a": 0.0}, ["a"]), "speed factor of a must be a number from 0.01 to 100, got 0.0"),
    (lambda: check_speeds({"a": 1e308}, ["a"]), "got 1e.308"),
    (lambda: check_speeds({"a": 1e-300}, ["a"]), "got 1e-300"),
    (lambda: check_speeds({"a": -1}, ["a"]), "got -1"),
    (lambda: check_speeds({"a": float("nan")}, ["a"]), "got nan"),
    (lambda: check_speeds({"a": True}, ["a"]), "got True"),
    (lambda: check_max_staleness(-1), "max_staleness must be an integer >= 0, got -1"),
    (lambda: check_max_staleness(1.5), "got 1.5"),
    (lambda: order_events({"a": [1, 1], "b": [1]}, {}, 0), "step 1 needs one more"),
])
def test_bad_schedule_input_names_the_value(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# -- the coordinator with K + 1 open rounds ------------------------------------------------------------


def test_k1_opens_a_second_round_but_not_a_third_and_closes_the_oldest_first(tmp_path):
    coord = make_coordinator(tmp_path, rounds=4, max_staleness=1)
    coord.register("a")
    coord.register("b")
    p0, p1 = coord.open_round(0), coord.open_round(1)
    assert coord.open_rounds() == [0, 1] and coord.open_round(0) == p0  # idempotent for an open round
    with pytest.raises(CoordinatorStateError, match=r"cannot open round 2: round 0 is still open \(max_staleness 1\)"):
        coord.open_round(2)
    assert coord.submit(scripted_submission(p1, "a")).recorded  # a lab one round ahead
    assert coord.submit(scripted_submission(p0, "a")).recorded
    assert coord.poll() is None  # round 0 waits for b
    assert coord.submit(scripted_submission(p0, "b")).recorded
    assert coord.poll() == "quorum" and coord.close_round("quorum").round_id == 0
    assert coord.open_rounds() == [1]
    coord.open_round(2)
    with pytest.raises(CoordinatorStateError, match="round 1 must be closed before a lab starts step 3"):
        coord.engine.update_for("a", 3)


def test_k0_keeps_one_round_open_with_the_old_message(tmp_path):
    coord = make_coordinator(tmp_path)
    coord.register("a")
    coord.open_round(0)
    with pytest.raises(CoordinatorStateError, match=r"cannot open round 1: round 0 is still open$"):
        coord.open_round(1)


def test_stale_updates_send_each_sample_once_with_its_staleness(tmp_path):
    coord = make_coordinator(tmp_path, rounds=3, max_staleness=1)
    coord.register("a")
    coord.register("b")
    p0, p1 = coord.open_round(0), coord.open_round(1)
    coord.submit(scripted_submission(p0, "a"))
    coord.submit(scripted_submission(p1, "a"))
    with pytest.raises(CoordinatorStateError, match="round 0 must be closed"):  # step 2 waits for round 0
        coord.engine.update_for("a", 2)
    built = coord.engine.update_for("a", 1)  # a's step 1: its own round-0 samples, nothing of b's yet
    assert {t.source_id for t in built.update.pool} == {"a"} and set(built.staleness) == {0}
    coord.submit(scripted_submission(p0, "b"))
    coord.close_round(coord.poll())
    coord.open_round(2)
    built = coord.engine.update_for("a", 2)  # its own round 1 (fresh) and b's round 0 (one round late)
    by_source = {(t.source_id, s) for t, s in zip(built.update.pool, built.staleness)}
    assert by_source == {("a", 0), ("b", 1)} and built.rounds.count(0) == 6 and built.rounds.count(1) == 6
    assert built.update.next_plan.round_id == 2
    assert coord.engine.update_for("a", 2) == built  # built again (a resend): the journaled choice, the same update
    assert coord.journal.sent_pairs("a") == {(0, "a"), (0, "b"), (1, "a")}  # none of them will be sent again


@pytest.mark.parametrize("k", [0, 1, 2])
def test_paced_runs_keep_the_journal_and_capabilities_of_the_synchronous_run(tmp_path, k):
    sync = make_coordinator(tmp_path / "sync", rounds=5, min_participants=2)
    run_rounds(sync, [ScriptedLab("a"), ScriptedLab("b")])
    labs = [ScriptedLab("a"), ScriptedLab("b")]
    paced = make_coordinator(tmp_path / "paced", rounds=5, min_participants=2, max_staleness=k)
    outcomes, records = run_paced(paced, labs, {"b": 3.0}, lambda lab, update, sub: 1.0)
    assert [o.round_id for o in outcomes] == list(range(5)) and all(o.closed.reason == "quorum" for o in outcomes)
    for r in range(5):
        assert paced.journal.round(r).capabilities == sync.journal.round(r).capabilities  # P̂ exact
        assert paced.journal.pool(r) == sync.journal.pool(r)
    for lab in labs:  # every accepted sample reaches every lab once, never older than K rounds
        got = sorted(t.trajectory_id for u in lab.sent for t in u.pool)
        assert got == sorted(t.trajectory_id for r in range(5) for t in sync.journal.pool(r))
    assert max(s for rec in records.values() for s in rec.staleness) == k  # the fast lab's peer samples
    assert max(s for (pid, _), rec in records.items() if pid == "b" for s in rec.staleness) == 0  # the slow lab's
    if k:
        assert records[("a", 5)].start == records[("b", 5)].start  # the final update waits for everyone
        assert sum(records[("a", t)].idle for t in range(5)) < sum(records[("b", t)].compute for t in range(5))


def test_a_paced_run_needs_a_fresh_journal(tmp_path):
    coord = make_coordinator(tmp_path, max_staleness=1)
    coord.register("a")
    coord.open_round(0)
    with pytest.raises(ValueError, match="fresh journal"):
        run_paced(coord, [ScriptedLab("a")], {}, lambda *a: 1.0)


# -- settings and the command line ----------------------------------------------------------------------


def test_max_staleness_is_a_coordinator_setting_that_binds_the_journal_only_when_set(tmp_path):
    assert make_config(tmp_path).max_staleness == 0
    assert "max_staleness" not in make_config(tmp_path).plan_fingerprint()
    assert make_config(tmp_path, max_staleness=2).plan_fingerprint()["max_staleness"] == 2
    assert make_config(tmp_path, max_staleness=2).quota_trajectories == 3 * make_config(tmp_path).quota_trajectories
    with pytest.raises(ValueError, match="max_staleness"):
        make_config(tmp_path, max_staleness=-1)


def test_lab_speeds_parse_and_refuse_bad_items():
    assert parse_lab_speeds(["tiny-gpt2=4", "tiny-llama=0.5"]) == (("tiny-gpt2", 4.0), ("tiny-llama", 0.5))
    for bad, match in (("foo", "AGENT=FACTOR"), ("=2", "AGENT=FACTOR"), ("a=x", "must be a number"),
                       ("a=0", "number from 0.01 to 100"), ("a=-2", "number from 0.01 to 100"), ("a=inf", "got .inf"),
                       ("a=101", "got .101"), ("a=0.001", "got .0.001")):
        with pytest.raises(ValueError, match=match):
            parse_lab_speeds([bad])
    with pytest.raises(ValueError, match="names a twice"):
        parse_lab_speeds(["a=1", "a=2"])
    with pytest.raises(ValueError, match="unknown agent 'nobody'"):
        SimConfig(lab_speeds=(("nobody", 2.0),))
    assert SimConfig(max_staleness=1).paced and not SimConfig().paced


@pytest.mark.parametrize("args, message", [
    (["--lab-speed", "foo"], "--lab-speed expects AGENT=FACTOR (e.g. tiny-gpt2=4), got 'foo'"),
    (["--lab-speed", "tiny-gpt2=0"], "--lab-speed tiny-gpt2: FACTOR must be a number from 0.01 to 100, got '0'"),
    (["--lab-speed", "tiny-gpt2=1e308"], "got '1e308'"),
    (["--lab-speed", "tiny-gpt2=1e-300"], "got '1e-300'"),
    (["--lab-speed", "nobody=2"], "lab speed for unknown agent 'nobody'; agents: tiny-llama, tiny-gpt2"),
    (["--max-staleness", "-1"], "max_staleness must be an integer >= 0, got -1"),
])
def test_cli_refuses_bad_pacing_without_traceback(capsys, args, message):
    assert main(["sim", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_fake_clock_is_untouched_by_paced_runs(tmp_path):
    clock = FakeClock()
    coord = make_coordinator(tmp_path, clock, rounds=2, min_participants=2, max_staleness=1)
    run_paced(coord, [ScriptedLab("a"), ScriptedLab("b")], {"a": 2.0}, lambda *a: 1.0, sleep=clock.sleep)
    assert clock.sleeps == []  # every round closed by quorum, on the simulated clock alone


def test_a_paced_sims_rows_carry_each_labs_step_on_the_clock(tmp_path):
    from hacfed.tools.sim_paced import run_paced_sim, simulated_end

    coord = make_coordinator(tmp_path, rounds=3, min_participants=2, max_staleness=1)
    rows: list[dict] = []

    def rows_of(outcome):
        return [{"round": outcome.round_id, "agent": m.participant_id} for m in outcome.summary.participants]

    records = run_paced_sim(coord, [ScriptedLab("a"), ScriptedLab("b")], {"b": 2.0}, rows_of, rows.append)
    assert [(r["round"], r["agent"]) for r in rows] == [(q, lab) for q in range(3) for lab in ("a", "b")]
    for row in rows:
        record = records[(row["agent"], row["round"])]
        assert row["sim/start_s"] == record.start and row["sim/idle_s"] == record.idle
        assert row["sim/trained_samples"] == len(record.staleness)
        assert row["sim/compute_s"] > 0  # scripted labs cost their tokens (no model: 1 parameter)
    late = [r for r in rows if r.get("sim/staleness_1")]
    assert late and all(r["agent"] == "a" and r["sim/staleness_max"] == 1.0 for r in late)
    assert simulated_end(rows).startswith("; simulated: a ") and simulated_end([{"agent": "a"}]) == ""


def test_every_round_of_a_paced_run_ends_published(tmp_path):
    coord = make_coordinator(tmp_path, rounds=4, min_participants=2, max_staleness=1)
    run_paced(coord, [ScriptedLab("a"), ScriptedLab("b")], {"b": 3.0}, lambda *a: 1.0)
    assert [coord.journal.round(r).state for r in range(4)] == ["PUBLISHED"] * 4
