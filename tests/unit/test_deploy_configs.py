"""Every TOML shipped under deploy/ parses and validates (docs/style.md rule 4)."""

from __future__ import annotations

import re
import shutil
import tomllib
from pathlib import Path

import pytest

from hacfed.certs import init_federation_certs
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


@pytest.fixture
def in_a_federation_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The current directory of the README's walk-through: certs/ from `certs init`, and what a lab
    received from the operator (coordinator.pub, ca.pem)."""
    certs = init_federation_certs(tmp_path / "certs", ["coordinator.example"])
    shutil.copy(certs.ca_cert, tmp_path / "ca.pem")
    shutil.copy(ensure_key_pair(tmp_path / "coordinator", "coordinator").public, tmp_path / "coordinator.pub")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_coordinator_toml_loads_as_is(in_a_federation_dir: Path) -> None:
    cfg = load_server_config(DEPLOY / "coordinator.toml", [], {"state_dir": str(in_a_federation_dir / "state")})
    assert not cfg.server.insecure and cfg.server.listen == "127.0.0.1:9092"  # TLS by default
    assert cfg.server.tls_ca == in_a_federation_dir / "certs" / "ca.pem"
    assert cfg.coordinator.expected_participants >= cfg.coordinator.min_participants
    task = load_task_from_config(cfg.coordinator, str(cfg.config_dir))
    assert task.name == "arith-add2"


def test_participant_toml_loads_and_matches_the_coordinators_task(in_a_federation_dir: Path) -> None:
    cfg = load_client_config(DEPLOY / "participant.toml")
    assert cfg.participant_id == "lab-a" and cfg.model == "tiny-llama" and not cfg.insecure
    assert cfg.tls_ca == in_a_federation_dir / "ca.pem"
    coordinator = load_server_config(DEPLOY / "coordinator.toml", [], {"state_dir": str(in_a_federation_dir / "s")})
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


def _defaults(cls: type) -> dict:
    from dataclasses import MISSING, fields

    return {f.name: f.default if f.default is not MISSING else f.default_factory()
            for f in fields(cls) if f.default is not MISSING or f.default_factory is not MISSING}


# Values the shipped files set on purpose to something else than the built-in default, and why.
DELIBERATE = {
    "coordinator.toml": {"answer_keys": "a real federation keeps the answers; the built-in default is for development",
                         "dedup_successes": "copies earn no P̂ or reach; the built-in default is the paper's P̂",
                         "format_gate": "text a filtered lab drops earns no P̂ or reach; the default is the paper's P̂",
                         "sampling.max_new_tokens": "the file's task, 2-digit addition, answers in 6 tokens",
                         "hacpo": "the recommended mode; the built-in default is the paper's exact HACPO"},
}


def test_coordinator_toml_agrees_with_the_defaults_and_runs_the_recommended_mode() -> None:
    from hacfed.hacpo_config import MODES
    from hacfed.messages import SamplingParams
    from hacfed.server.config import ServerSettings
    from hacfed.server.coordinator import CoordinatorConfig
    from hacfed.tools.modes import MODES as NAMED_MODES
    from hacfed.tools.modes import RECOMMENDED

    text = (DEPLOY / "coordinator.toml").read_text(encoding="utf-8")
    data = tomllib.loads(text)
    tables = {"": (data, CoordinatorConfig), "sampling.": (data["sampling"], SamplingParams),
              "server.": (data["server"], ServerSettings)}
    differ = []
    for prefix, (table, cls) in tables.items():
        defaults = _defaults(cls)
        differ += [f"{prefix}{k}" for k, v in table.items()
                   if not isinstance(v, dict) and k in defaults and defaults[k] is not None and v != defaults[k]]
    assert differ == [k for k in DELIBERATE["coordinator.toml"] if k != "hacpo"], differ
    assert data["hacpo"] == dict(NAMED_MODES[RECOMMENDED].settings)  # what hacfed sim / demo run by default
    listed = next(line for line in text.splitlines() if line.startswith("# mode:"))
    assert listed.removeprefix("# mode:").split(".")[0].replace(" ", "").split("|") == [RECOMMENDED, *[
        m for m in MODES if m != RECOMMENDED]], listed


def test_participant_toml_agrees_with_the_cli_defaults() -> None:
    """Every local choice in deploy/participant.toml is hacfed-client's default (e.g. --lr 5e-05)."""
    from hacfed.clients.config import ClientConfig
    from hacfed.clients.main import build_parser
    from hacfed.clients.participant import ParticipantConfig

    table = tomllib.loads((DEPLOY / "participant.toml").read_text(encoding="utf-8"))["participant"]
    defaults = {**_defaults(ParticipantConfig), **{k: v for k, v in _defaults(ClientConfig).items() if v is not None}}
    choices = {k: v for k, v in table.items() if k in defaults and defaults[k] is not None}
    assert {"learning_rate", "eval_problems", "seed", "finetune", "device", "keep_checkpoints"} <= set(choices)
    assert {k: v for k, v in choices.items() if v != defaults[k]} == {}
    lr_help = next(a.help for a in build_parser()._actions if a.dest == "learning_rate")
    assert f"(default: {defaults['learning_rate']})" in lr_help  # the help states the same default


def _named(block: str, candidates: set[str]) -> set[str]:
    return {name for name in candidates if re.search(rf"(?<![\w.]){name}(?![\w.])", block)}


def _comment(text: str, start: str) -> str:
    """The comment paragraph that begins with `start`."""
    lines = text[text.index(start):].splitlines()
    return " ".join(next(iter([lines[:i] for i, line in enumerate(lines) if line.strip() in ("#", "")]), lines))


def test_the_required_keys_are_documented_as_the_code_requires_them() -> None:
    """deploy/*.toml and docs/operating.md name exactly the keys the configs refuse to start without."""
    from dataclasses import MISSING, fields

    from hacfed.clients.config import REQUIRED, setting_names
    from hacfed.server.coordinator.config import CoordinatorConfig

    every = {f.name for f in fields(CoordinatorConfig)}
    coordinator = {f.name for f in fields(CoordinatorConfig) if f.default is MISSING and f.default_factory is MISSING}
    lab_every, lab = {*setting_names(), "tls_ca", "insecure"}, {*REQUIRED, "tls_ca", "insecure"}
    assert _named(_comment((DEPLOY / "coordinator.toml").read_text(), "# Required keys:"), every) == coordinator
    assert _named(_comment((DEPLOY / "participant.toml").read_text(), "# Required, here or as flags:"),
                  lab_every) == lab
    table = (DEPLOY.parent / "docs" / "operating.md").read_text().split("## Configuration files")[1]
    rows = [line.split("|")[2] for line in table.splitlines() if line.startswith(("| coordinator", "| lab"))]
    assert [_named(rows[0], every), _named(rows[1], lab_every)] == [coordinator, lab]
