"""Metrics sinks: TensorBoard tags are the JSONL keys with the same values; the lab logs each step;
--tensorboard / --wandb without their package are one line and exit code 2."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from hacfed.metrics_sinks import MissingPackage, open_logger, require_wandb, scalar_items, step_row

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

ROWS = [
    {"round": 0, "agent": "lab-a", "mode": "xhacpo", "seed": 0, "reward_mean": 0.25, "accepted": 16, "rejected": 0,
     "capability": 0.25, "eval_accuracy": 0.4, "train/time_rollout_s": 0.5},
    {"round": 1, "agent": "lab-a", "mode": "xhacpo", "seed": 0, "reward_mean": 0.5, "accepted": 14, "rejected": 2,
     "capability": 0.375, "train/loss": -0.125, "train/cross/lab-b/ratio_p50": 0.875,
     "train/cross/lab-b/grad_frac": 1.0},
    {"round": 2, "agent": "lab-a", "mode": "xhacpo", "seed": 0, "final": True, "eval_accuracy": 0.5},
]


def _scalars(log_dir: Path) -> dict[str, dict[int, float]]:
    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def test_tensorboard_tags_are_the_jsonl_keys_with_their_values(tmp_path: Path) -> None:
    jsonl, tb = tmp_path / "metrics.jsonl", tmp_path / "tb"
    logger = open_logger(jsonl=jsonl, tensorboard_dir=tb)
    for row in ROWS:
        logger.write(row)
    logger.close()
    written = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert written == ROWS
    expected: dict[str, dict[int, float]] = {}
    for row in written:
        for key, value in row.items():
            if key not in ("round", "seed", "agent", "mode", "final"):
                expected.setdefault(key, {})[row["round"]] = value
    got = _scalars(tb)
    assert set(got) == set(expected)  # e.g. "train/cross/lab-b/ratio_p50", not a renamed tag
    for tag, by_step in expected.items():
        assert got[tag] == pytest.approx(by_step, rel=1e-6), tag


def test_scalar_items_leave_out_the_step_the_seed_and_non_numbers() -> None:
    assert scalar_items({"round": 3, "seed": 1, "agent": "a", "final": True, "x": 2, "y": float("nan"),
                         "reward_mean": None}) == {"x": 2.0}


def test_step_row_is_in_the_coordinators_format() -> None:
    row = step_row("lab-a", 4, "xhacpo", 0, {"reward_mean": 0.5, "loss": 0.1, "cross/lab-b/ratio_p50": 0.9,
                                             "eval_pass1": 0.3}, 0.25, final=False)
    assert row == {"round": 4, "agent": "lab-a", "mode": "xhacpo", "seed": 0, "reward_mean": 0.5,
                   "eval_accuracy": 0.25, "eval_pass1": 0.3, "train/reward_mean": 0.5, "train/loss": 0.1,
                   "train/cross/lab-b/ratio_p50": 0.9, "train/eval_pass1": 0.3}
    final = step_row("lab-a", 5, "xhacpo", 0, {"loss": 0.2}, 0.5, final=True)
    assert final["final"] is True and "reward_mean" not in final and final["eval_accuracy"] == 0.5


def test_the_lab_logs_every_answered_step_to_its_sinks(tmp_path: Path) -> None:
    from hacfed.clients.config import load_client_config
    from hacfed.clients.runner import Client
    from hacfed.clients.service import Answered
    from hacfed.keys import ensure_key_pair
    from hacfed.messages import RoundUpdate, StepReport, Submission
    from hacfed.server.coordinator.plan import make_plan
    from tests.unit.test_coordinator_fakes import TASK, make_config, scripted_trajectories

    key = ensure_key_pair(tmp_path / "server", "coordinator").public
    cfg = load_client_config(None, {"participant_id": "lab-a", "model": "tiny-llama", "server": "127.0.0.1:9092",
                                    "state_dir": str(tmp_path / "lab-a"), "coordinator_key": str(key),
                                    "insecure": True, "tensorboard": str(tmp_path / "tb")})
    assert cfg.tensorboard == (tmp_path / "tb").resolve()
    plan = make_plan(make_config(tmp_path), TASK, 1)
    update = RoundUpdate("test-run", 0, tuple(scripted_trajectories(plan, "lab-b")), {"lab-a": 0.5}, plan)
    report = StepReport("lab-a", 1, {"loss": 0.25, "reward_mean": 0.5, "time_rollout_s": 0.5}, 0.75)
    logger = open_logger(jsonl=tmp_path / "lab-a" / "metrics.jsonl", tensorboard_dir=cfg.tensorboard)
    client = Client(cfg, logger)
    client.on_answer(Answered(update, Submission("test-run", "lab-a", 1, (), report), 1.0, False))
    client.on_answer(Answered(update, None, 0.0, True))  # a cached resend: not a new step
    logger.close()
    rows = [json.loads(line) for line in (tmp_path / "lab-a" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["round"] == 1 and rows[0]["train/loss"] == 0.25
    assert rows[0]["mode"] == update.hacpo.mode and rows[0]["eval_accuracy"] == 0.75
    got = _scalars(cfg.tensorboard)
    assert set(got) == set(scalar_items(rows[0])) and got["train/loss"] == {1: 0.25}


def _hide(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == name else real(n, *a))


def test_wandb_is_refused_in_one_line_when_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    _hide(monkeypatch, "wandb")
    with pytest.raises(MissingPackage, match="--wandb needs the wandb package"):
        require_wandb()
    with pytest.raises(MissingPackage):
        open_logger(wandb_project="hacfed")


@pytest.mark.parametrize("flag, package", [("--wandb", "wandb"), ("--tensorboard", "tensorboard")])
def test_client_flag_without_its_package_exits_2_before_any_file(
        flag: str, package: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture) -> None:
    from hacfed.clients.main import main
    from hacfed.keys import ensure_key_pair

    _hide(monkeypatch, package)
    key = ensure_key_pair(tmp_path / "server", "coordinator").public
    state = tmp_path / "lab-a"
    code = main(["--model", "tiny-llama", "--server", "127.0.0.1:9092", "--participant-id", "lab-a", "--state-dir",
                 str(state), "--coordinator-key", str(key), "--insecure", flag, str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert code == 2 and f"{flag} needs the {package} package" in err and "Traceback" not in err
    assert not state.exists()


def test_sim_tensorboard_without_the_package_exits_2(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    from hacfed.tools.cli import main

    _hide(monkeypatch, "tensorboard")
    code = main(["sim", "--agents", "tiny-llama", "--rounds", "1", "--tensorboard", str(tmp_path / "tb")])
    err = capsys.readouterr().err
    assert code == 2 and "--tensorboard needs the tensorboard package" in err


def test_wandb_sink_logs_the_same_scalars_at_step_round(monkeypatch: pytest.MonkeyPatch) -> None:
    """Against a stand-in `wandb` module (hacfed does not install wandb): project, run name, and
    log(scalars, step=round) with the JSONL keys."""
    import sys
    import types

    calls: list[tuple] = []

    class Run:
        def log(self, data: dict, step: int) -> None:
            calls.append(("log", data, step))

        def finish(self) -> None:
            calls.append(("finish",))

    fake = types.ModuleType("wandb")
    fake.init = lambda **kw: calls.append(("init", kw)) or Run()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: object() if n == "wandb" else real(n, *a))
    logger = open_logger(wandb_project="hacfed-test", run_name="lab-a")
    logger.write(ROWS[1])
    logger.close()
    assert calls[0] == ("init", {"project": "hacfed-test", "name": "lab-a", "config": {}})
    assert calls[1] == ("log", scalar_items(ROWS[1]), 1) and "train/cross/lab-b/ratio_p50" in calls[1][1]
    assert calls[2] == ("finish",)
