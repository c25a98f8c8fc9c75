"""`hacfed-client --slowdown FACTOR` (hacfed.clients.slowdown): each step waits (FACTOR - 1) x its
rollout and training time after its checkpoint, before the reply; bad factors are refused in one line."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hacfed.clients.config import load_client_config
from hacfed.clients.main import main
from hacfed.clients.slowdown import SlowedParticipant, check_slowdown, compute_seconds, stretch_s
from hacfed.keys import ensure_key_pair


@dataclass
class _Timings:
    rollout_s: float = 0.0
    training_s: float = 0.0
    eval_s: float = 0.0


@dataclass
class _Lab:
    participant_id: str = "lab-a"
    last_round: int | None = None
    last_pool_round: int | None = None
    timings: _Timings = field(default_factory=_Timings)
    events: list = field(default_factory=list)

    def step(self, update, before_checkpoint=None):
        self.timings = _Timings(rollout_s=0.5, training_s=1.5, eval_s=30.0)  # evaluation is not stretched
        if before_checkpoint is not None:
            before_checkpoint("submission")
        self.events.append("checkpoint")
        self.last_round = 3
        return "submission"


def test_a_step_waits_factor_minus_one_times_its_rollout_and_training_after_its_checkpoint():
    lab, slept = _Lab(), []

    def sleep(seconds):
        lab.events.append(("sleep", seconds))
        slept.append(seconds)

    slowed = SlowedParticipant(lab, 4.0, sleep=sleep)
    kept = []
    assert slowed.step("update", before_checkpoint=kept.append) == "submission" and kept == ["submission"]
    assert slept == [pytest.approx(3 * 2.0)] and slowed.slept_s == pytest.approx(6.0)
    assert lab.events == ["checkpoint", ("sleep", pytest.approx(6.0))]  # the reply waits, the checkpoint does not
    assert slowed.participant_id == "lab-a" and slowed.last_round == 3  # everything else is the lab's own
    assert SlowedParticipant(lab, 1, sleep=slept.append).step("u") == "submission" and len(slept) == 1  # no wait


def test_stretch_and_compute_seconds():
    assert stretch_s(4.0, 2.0) == 6.0 and stretch_s(1.0, 5.0) == 0.0 and stretch_s(2.0, -1.0) == 0.0
    assert compute_seconds(_Lab(timings=_Timings(1.0, 2.0, 9.0)), wall_s=50.0) == 3.0
    assert compute_seconds(object(), wall_s=5.0) == 5.0  # no timings: the step's wall time


@pytest.mark.parametrize("bad", [0.5, 0, -2, float("nan"), float("inf"), True, "2", 100.5, 1e308])
def test_a_factor_below_1_above_100_or_not_a_number_is_refused(bad):
    with pytest.raises(ValueError, match=r"slowdown must be a finite number >= 1 and <= 100 \(1: no slowdown\), got"):
        check_slowdown(bad)


@pytest.fixture
def flags(tmp_path: Path) -> dict:
    key = ensure_key_pair(tmp_path / "server", "coordinator").public
    return {"participant_id": "lab-a", "model": "tiny-llama", "server": "127.0.0.1:9092",
            "state_dir": str(tmp_path / "lab-a"), "coordinator_key": str(key), "insecure": True}


def test_the_client_setting_and_flag(flags, tmp_path, capsys):
    assert load_client_config(None, flags).slowdown == 1.0
    assert load_client_config(None, {**flags, "slowdown": 4}).slowdown == 4.0
    path = tmp_path / "p.toml"
    path.write_text("[participant]\nslowdown = 2.5\n")
    assert load_client_config(path, flags).slowdown == 2.5
    with pytest.raises(ValueError, match=r"ClientConfig.slowdown must be a finite number >= 1 .*got 0.5"):
        load_client_config(None, {**flags, "slowdown": 0.5})
    code = main(["--model", "tiny-llama", "--server", "127.0.0.1:1", "--participant-id", "lab-a", "--state-dir",
                 flags["state_dir"], "--coordinator-key", flags["coordinator_key"], "--insecure", "--slowdown", "0"])
    err = capsys.readouterr().err
    assert code == 2 and "ClientConfig.slowdown must be a finite number >= 1" in err and "Traceback" not in err
