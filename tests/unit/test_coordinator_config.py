"""CoordinatorConfig: TOML loading with nested tables, validation naming the field, overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from hacfed.hacpo_config import HacpoConfig
from hacfed.messages import SamplingParams
from hacfed.server.coordinator import CoordinatorConfig, load_coordinator_config, load_task_from_config
from hacfed.server.coordinator.config import apply_overrides

TOML = """
[coordinator]
run_id = "demo-1"
rounds = 4
prompts_per_round = 8
group_size = 4
expected_participants = 3
min_participants = 2
round_deadline_s = 30
state_dir = "state/coord"
eval_every = 2
[coordinator.task]
kind = "arithmetic"
digits = 3
[coordinator.sampling]
max_new_tokens = 12
[coordinator.hacpo]
mode = "naive"
alpha = 0.5
"""


def base(**changes):
    data = dict(
        run_id="r", task={"kind": "arithmetic"}, rounds=2, prompts_per_round=2, group_size=2,
        expected_participants=2, min_participants=1, round_deadline_s=10, state_dir="s",
    )
    data.update(changes)
    return data


def test_load_toml_with_nested_tables(tmp_path: Path):
    path = tmp_path / "coord.toml"
    path.write_text(TOML)
    cfg = load_coordinator_config(path)
    assert cfg.run_id == "demo-1" and cfg.rounds == 4 and cfg.group_size == 4
    assert dict(cfg.task) == {"kind": "arithmetic", "digits": 3}
    assert cfg.sampling == SamplingParams(max_new_tokens=12)
    assert cfg.hacpo == HacpoConfig(mode="naive", alpha=0.5)
    assert cfg.round_deadline_s == 30.0 and isinstance(cfg.round_deadline_s, float)
    assert cfg.state_dir == Path("state/coord") and cfg.journal_path == Path("state/coord/journal.sqlite")
    # defaults documented in the brief
    assert cfg.max_strikes == 3 and cfg.max_submission_bytes == 16 * 1024 * 1024 and cfg.min_mean_logp == -50.0


def test_load_with_overrides_and_round_trip(tmp_path: Path):
    path = tmp_path / "coord.toml"
    path.write_text(TOML)
    cfg = load_coordinator_config(path, {"rounds": 9, "sampling.temperature": 0.7, "hacpo": {"alpha": 2.0}})
    assert cfg.rounds == 9 and cfg.sampling.temperature == 0.7 and cfg.sampling.max_new_tokens == 12
    assert cfg.hacpo.alpha == 2.0 and cfg.hacpo.mode == "naive"  # nested mapping merged, not replaced
    assert CoordinatorConfig.from_mapping(cfg.to_dict()) == cfg


@pytest.mark.parametrize(
    "field, value",
    [
        ("run_id", ""), ("run_id", "has space"), ("rounds", 0), ("rounds", 2.5), ("rounds", True),
        ("prompts_per_round", 0), ("group_size", -1), ("expected_participants", 0), ("min_participants", 3),
        ("round_deadline_s", 0), ("round_deadline_s", float("nan")), ("eval_every", -1), ("max_strikes", 0),
        ("strike_window_rounds", 0), ("max_response_chars", 0), ("max_submission_bytes", 10),
        ("min_mean_logp", 0.0), ("task", {}), ("task", "arithmetic"), ("state_dir", ""),
    ],
)
def test_invalid_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"CoordinatorConfig.{field} must be"):
        CoordinatorConfig.from_mapping(base(**{field: value}))


def test_unknown_and_missing_keys_are_named():
    with pytest.raises(ValueError, match=r"unknown coordinator config key\(s\): \['roundz'\]"):
        CoordinatorConfig.from_mapping(base(roundz=3))
    data = base()
    del data["group_size"]
    with pytest.raises(ValueError, match=r"missing required key\(s\): \['group_size'\]"):
        CoordinatorConfig.from_mapping(data)
    with pytest.raises(ValueError, match=r"CoordinatorConfig.sampling: unknown key\(s\) \['top_k'\]"):
        CoordinatorConfig.from_mapping(base(sampling={"top_k": 5}))
    with pytest.raises(ValueError, match="HacpoConfig.alpha"):
        CoordinatorConfig.from_mapping(base(hacpo={"alpha": -1}))


def test_task_table_builds_the_task_through_the_registry():
    cfg = CoordinatorConfig.from_mapping(base(task={"kind": "arithmetic", "digits": 3, "num_train": 50, "num_eval": 5}))
    task = load_task_from_config(cfg)
    assert len(task.train_problems()) == 50 and task.train_problems()[0].prompt_id.startswith("add3:")


def test_overrides_are_validated_and_bad_paths_rejected():
    cfg = CoordinatorConfig.from_mapping(base())
    with pytest.raises(ValueError, match="CoordinatorConfig.rounds"):
        cfg.with_overrides({"rounds": -3})
    with pytest.raises(ValueError, match="nested settings"):
        cfg.with_overrides({"rounds.x": 1})
    assert cfg.with_overrides({"task.digits": 4}).task == {"kind": "arithmetic", "digits": 4}
    assert cfg.rounds == 2  # the original is unchanged


def test_overrides_apply_to_a_files_table_before_it_is_validated():
    """hacfed-server builds the coordinator section once, from the file's table with --set applied."""
    table = base(task={"kind": "plugin", "plugin": "p"})
    merged = apply_overrides(table, {"task.sandbox.timeout_s": 5, "hacpo.mode": "naive", "rounds": 0})
    assert merged["task"] == {"kind": "plugin", "plugin": "p", "sandbox": {"timeout_s": 5}}
    assert merged["hacpo"] == {"mode": "naive"} and merged["rounds"] == 0  # not validated yet
    assert table["task"] == {"kind": "plugin", "plugin": "p"} and "hacpo" not in table  # the input is unchanged
    with pytest.raises(ValueError, match="CoordinatorConfig.sampling must be a table, got 5"):
        apply_overrides(base(sampling=5), {"sampling.max_new_tokens": 8})


def test_task_table_is_a_read_only_copy():
    task = {"kind": "arithmetic"}
    cfg = CoordinatorConfig.from_mapping(base(task=task))
    task["kind"] = "changed"
    assert cfg.task["kind"] == "arithmetic"
    with pytest.raises(TypeError):
        cfg.task["kind"] = "x"  # type: ignore[index]


def test_missing_file_and_bad_toml_are_clear_errors(tmp_path: Path):
    with pytest.raises(ValueError, match="not found"):
        load_coordinator_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("rounds = = 3")
    with pytest.raises(ValueError, match="not valid TOML"):
        load_coordinator_config(bad)
