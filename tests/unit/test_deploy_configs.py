"""Every TOML shipped under deploy/ parses and validates (style.md rule 4)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from hacfed.clients.config import load_client_config
from hacfed.keys import ensure_key_pair
from hacfed.server.config import load_server_config
from hacfed.server.coordinator import load_task_from_config
from hacfed.tasks.registry import load_task

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


@pytest.mark.parametrize("path", sorted(DEPLOY.glob("*.toml")), ids=lambda p: p.name)
def test_every_deploy_toml_is_valid_toml(path: Path) -> None:
    assert tomllib.loads(path.read_text(encoding="utf-8"))


def test_known_deploy_files_are_the_ones_tested() -> None:
    assert {p.name for p in DEPLOY.glob("*.toml")} == {"coordinator.toml", "participant.toml"}


def test_coordinator_toml_loads_as_is(tmp_path: Path) -> None:
    cfg = load_server_config(DEPLOY / "coordinator.toml", [], {"state_dir": str(tmp_path / "state")})
    assert cfg.server.insecure and cfg.server.listen == "127.0.0.1:9092"
    assert cfg.coordinator.expected_participants >= cfg.coordinator.min_participants
    task = load_task_from_config(cfg.coordinator, str(cfg.config_dir))
    assert task.name == "arith-add2"


def test_participant_toml_loads_and_matches_the_coordinators_task(tmp_path: Path) -> None:
    key = ensure_key_pair(tmp_path, "coordinator").public  # the file names a path that exists once a server ran
    cfg = load_client_config(DEPLOY / "participant.toml", {"coordinator_key": str(key)})
    assert cfg.participant_id == "lab-a" and cfg.model == "tiny-llama" and cfg.insecure
    coordinator = load_server_config(DEPLOY / "coordinator.toml", [], {"state_dir": str(tmp_path / "s")})
    assert cfg.task == dict(coordinator.coordinator.task)
    assert load_task(cfg.task).name == "arith-add2"


def test_the_commented_gsm8k_task_names_the_data_shipped_in_the_clone() -> None:
    text = (DEPLOY / "coordinator.toml").read_text(encoding="utf-8")
    block = "\n".join(line.removeprefix("# ") for line in text.splitlines()
                      if line.startswith("# ") and line.split("=")[0].strip("# ") in
                      ("kind", "name", "train_files", "eval_files", "answer_format"))
    spec = tomllib.loads(block)
    assert spec["kind"] == "jsonl" and spec["name"] == "gsm8k"
    for path in spec["train_files"] + spec["eval_files"]:
        assert (DEPLOY / path).resolve().is_relative_to(DEPLOY.parent), path  # inside the clone
        assert (DEPLOY / path).is_file(), path
