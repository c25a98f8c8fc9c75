"""The tests' coordinator config (tests/federation.py `coordinator_toml`): hacfed-server's own loader
takes it, with every key where the tests put it."""

from __future__ import annotations

import tomllib
from pathlib import Path

from hacfed.server.config import load_server_config
from tests.federation import coordinator_toml


def test_the_defaults_are_tiny_rounds_of_two_digit_additions() -> None:
    assert tomllib.loads(coordinator_toml("it-x", rounds=3, expected_participants=2, min_participants=1)) == {
        "run_id": "it-x", "rounds": 3, "prompts_per_round": 2, "group_size": 2, "expected_participants": 2,
        "min_participants": 1, "round_deadline_s": 120, "state_dir": "server",
        "task": {"kind": "arithmetic", "digits": 2, "operators": "+"}, "sampling": {"max_new_tokens": 6}}


def test_hacfed_server_loads_it_with_its_tables_and_extra_keys(tmp_path: Path) -> None:
    task = {"kind": "plugin", "plugin": "reverse-word", "train_files": ["a \"b\".jsonl"], "sandbox": {"timeout_s": 10}}
    text = coordinator_toml("it-y", rounds=5, expected_participants=3, min_participants=2, round_deadline_s=20.5,
                            max_staleness=2, answer_keys="coordinator", task=task, max_new_tokens=None,
                            server={"retry_interval_s": 1.0})
    parsed = tomllib.loads(text)
    assert parsed["task"] == task and "sampling" not in parsed and parsed["server"] == {"retry_interval_s": 1.0}
    arithmetic = coordinator_toml("it-y", rounds=5, expected_participants=3, min_participants=2, round_deadline_s=20.5,
                                  max_staleness=2, answer_keys="coordinator", server={"retry_interval_s": 1.0})
    (tmp_path / "coordinator.toml").write_text(arithmetic)
    config = load_server_config(tmp_path / "coordinator.toml", flags={"insecure": True, "state_dir": tmp_path / "s"})
    coordinator = config.coordinator
    assert (coordinator.run_id, coordinator.rounds, coordinator.max_staleness) == ("it-y", 5, 2)
    assert (coordinator.expected_participants, coordinator.min_participants) == (3, 2)
    assert coordinator.round_deadline_s == 20.5 and coordinator.answer_keys == "coordinator"
    assert coordinator.sampling.max_new_tokens == 6 and coordinator.task["operators"] == "+"
    assert config.server.retry_interval_s == 1.0
