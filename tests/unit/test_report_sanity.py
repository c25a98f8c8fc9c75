"""A lab's step report cannot break the coordinator's time split, metrics file or dashboard:
values out of their ranges are dropped at the driver, nothing non-finite is written, and the
dashboard's reader skips a line that is not JSON (issue: 1.7e308 + 1.7e308 = Infinity)."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from hacfed.messages import RoundUpdate, Submission
from hacfed.server.dashboard.reader import MetricsTail, curves, time_split
from hacfed.server.reporting import StepTimes, append_rows, sane_metrics, split_round
from tests.unit.test_coordinator_fakes import FakeClock
from tests.unit.test_server_driver import Federation, ScriptedParticipant

HUGE = 1.7e308


def test_only_finite_values_in_their_ranges_are_kept() -> None:
    kept, dropped = sane_metrics({
        "time_training_s": HUGE, "time_eval_s": -1.0, "time_rollout_s": 2.5, "rollout_truncated_frac": 1.5,
        "eval_greedy/first": 0.5, "num_cross": -3.0, "loss": float("nan"), "grad_norm": float("inf"),
        "kl": 0.01, "reward_mean": 1e300,
    })
    assert kept == {"time_rollout_s": 2.5, "eval_greedy/first": 0.5, "kl": 0.01}
    assert len(dropped) == 7 and any(d.startswith("time_training_s = 1.7e+308 is outside") for d in dropped)


def test_huge_reported_times_leave_the_split_finite() -> None:
    step = StepTimes.from_report({"time_training_s": HUGE, "time_checkpoint_s": HUGE, "time_rollout_s": 3.0}, 10.0)
    assert (step.training_s, step.checkpoint_s, step.rollout_s) == (0.0, 0.0, 3.0)
    times = split_round(20.0, 1.0, {"lab": step})
    assert times.exchange_s == 16.0


def test_non_finite_values_are_never_written(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    append_rows(path, [{"round": 0, "agent": "a", "time_training_s": float("inf"), "x": float("nan"), "y": 1.0}])
    text = path.read_text()
    assert "Infinity" not in text and "NaN" not in text and json.loads(text) == {"round": 0, "agent": "a", "y": 1.0}


def test_the_dashboard_reader_skips_a_non_json_line_and_huge_times(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    good = {"round": 0, "agent": "a", "reward_mean": 0.5, "time_round_s": 10.0, "time_rollout_s": 1.0,
            "time_training_s": 2.0, "time_eval_s": 0.0, "time_exchange_s": 1.0}
    bad = dict(good, agent="b", time_training_s=float("inf"))
    huge = dict(good, round=1, time_round_s=HUGE, time_training_s=HUGE, time_exchange_s=HUGE)
    path.write_text("\n".join(json.dumps(r) for r in (good, bad, huge)) + "\n")  # "Infinity" on line 2
    rows = MetricsTail(path).read()
    assert [(r["round"], r["agent"]) for r in rows] == [(0, "a"), (1, "a")]
    state = {"curves": curves(rows), "time": time_split(rows)}
    json.dumps(state, allow_nan=False)  # what the dashboard answers with: no 500
    assert state["time"]["rounds"] == [0]


class HugeTimesParticipant(ScriptedParticipant):
    """Reports 1.7e308 s of training and of checkpointing every step."""

    def step(self, update: RoundUpdate, before_checkpoint=None) -> Submission:
        sub = super().step(update)
        metrics = dict(sub.report.metrics, time_training_s=HUGE, time_checkpoint_s=HUGE)
        sub = dataclasses.replace(sub, report=dataclasses.replace(sub.report, metrics=metrics))
        if before_checkpoint is not None:
            before_checkpoint(sub)  # the outbox keeps what is sent
        return sub


class RefusedReportParticipant(ScriptedParticipant):
    """Sends a report the coordinator refuses (another lab's id) with plausible times."""

    def step(self, update: RoundUpdate, before_checkpoint=None) -> Submission:
        sub = super().step(update)
        if update.next_plan is not None:
            metrics = dict(sub.report.metrics, time_rollout_s=500.0)
            report = dataclasses.replace(sub.report, participant_id="someone-else", metrics=metrics)
            sub = dataclasses.replace(sub, report=report)
        if before_checkpoint is not None:
            before_checkpoint(sub)  # the outbox keeps what is sent
        return sub


def test_a_lab_reporting_huge_times_cannot_make_the_metrics_or_console_infinite(tmp_path: Path) -> None:
    fed = Federation(tmp_path, FakeClock())
    fed.add(1, "huge", participant=HugeTimesParticipant("huge"))
    fed.add(2, "refused", participant=RefusedReportParticipant("refused"))
    fed.run()
    text = fed.config.metrics_out.read_text()
    assert "Infinity" not in text and "NaN" not in text
    rows = [json.loads(x, parse_constant=lambda c: 1 / 0) for x in text.splitlines()]
    per_round = [r for r in rows if not r.get("final")]
    assert {r["agent"] for r in per_round} == {"huge", "refused"}
    for row in per_round:
        assert row["time_training_s"] == 0.0
        # the huge lab's sane values are kept; nothing is taken from a refused report
        assert row["time_rollout_s"] == (0.25 if row["agent"] == "huge" else 0.0)
    dropped = [line for line in fed.lines if "report values dropped" in line]
    assert len(dropped) == 1 and dropped[0].startswith("huge:") and "time_training_s" in dropped[0]
    assert all(len(line) < 300 for line in fed.lines if " closed (" in line)
    json.dumps(time_split(MetricsTail(fed.config.metrics_out).read()), allow_nan=False)
