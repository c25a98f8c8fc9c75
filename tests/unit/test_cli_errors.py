"""Clear errors everywhere (issue 9, item 8): every bad configuration value, a corrupt journal or
outbox, and a read-only state directory give ONE line naming the problem and a non-zero exit, never
a traceback, for hacfed-server and hacfed-client.

The configuration tests try hostile values of every type on every field of every table (in
process: a value that slipped through would otherwise start a federation); the command-line tests
run the real entry points in child processes and read their whole output.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from hacfed.clients.config import load_client_config, setting_names
from hacfed.hacpo_config import HacpoConfig
from hacfed.keys import ensure_key_pair
from hacfed.messages import SamplingParams
from hacfed.server.config import ServerSettings, load_server_config
from hacfed.server.coordinator import CoordinatorConfig

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
HOSTILE = ["hot", "", -1, 0, 2.5, float("nan"), float("inf"), True, [1, 2], {"a": 1}, 10**30]
SERVER_TOML = REPO / "deploy" / "coordinator.toml"


def _only_value_errors(load) -> int:
    """How many hostile values `load(value)` refused; anything but ValueError is a failure."""
    refused = 0
    for value in HOSTILE:
        try:
            load(value)
        except ValueError as exc:
            refused += 1
            assert "\n" not in str(exc) and len(str(exc)) < 2000, str(exc)
    return refused


def _settings_keys() -> list[str]:
    keys = [f.name for f in fields(CoordinatorConfig) if f.name not in ("sampling", "hacpo", "state_dir")]
    keys += [f"sampling.{f.name}" for f in fields(SamplingParams)]
    keys += [f"hacpo.{f.name}" for f in fields(HacpoConfig)]
    keys += [f"server.{f.name}" for f in fields(ServerSettings)]
    return keys + ["task.digits", "task.kind", "task.operators", "task.num_train"]


@pytest.mark.parametrize("key", _settings_keys())
def test_every_server_setting_refuses_bad_values_with_a_value_error(key, tmp_path):
    def load(value):
        cfg = load_server_config(SERVER_TOML, [f"{key}={_toml(value)}"], {"state_dir": str(tmp_path)})
        from hacfed.server.coordinator import load_task_from_config

        load_task_from_config(cfg.coordinator, str(cfg.config_dir))  # what hacfed-server checks next

    assert _only_value_errors(load) >= 1, f"{key} accepted every hostile value"


@pytest.mark.parametrize("name", setting_names())  # every [participant] key, ClientConfig's and ParticipantConfig's
def test_every_client_setting_refuses_bad_values_with_a_value_error(name, tmp_path):
    key = ensure_key_pair(tmp_path, "coordinator").public
    base = {"participant_id": "lab-a", "model": "tiny-llama", "server": "127.0.0.1:9092", "state_dir": str(tmp_path),
            "coordinator_key": str(key), "insecure": True}

    def load(value):
        load_client_config(None, {**base, name: value})

    assert _only_value_errors(load) >= 1, f"{name} accepted every hostile value"


@pytest.mark.parametrize("text", ["task = 3", "participant = 3", '[task]\nkind = 3', '[task]\ndigits = "hot"',
                                  "[participant]\nseed = [1]", "[other]\nx = 1", "not toml ["])
def test_client_config_files_refuse_bad_tables_with_a_value_error(text, tmp_path):
    path = tmp_path / "lab.toml"
    path.write_text(text + "\n")
    key = ensure_key_pair(tmp_path, "coordinator").public
    flags = {"participant_id": "lab-a", "model": "m", "server": "127.0.0.1:1", "state_dir": str(tmp_path),
             "coordinator_key": str(key), "insecure": True}
    with pytest.raises(ValueError):
        cfg = load_client_config(path, flags)
        from hacfed.tasks.registry import load_task

        load_task(cfg.task, base_dir=cfg.config_dir)  # what hacfed-client checks next


def _toml(value) -> str:
    import json
    import math

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else "inf"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, str):
        return value if value and value.isalpha() else json.dumps(value)  # --set takes bare words too
    return json.dumps(value)


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, cwd=cwd, timeout=120, check=False)


def _one_line_error(result: subprocess.CompletedProcess, prog: str, *fragments: str) -> None:
    output = (result.stdout + result.stderr).strip()
    assert result.returncode == 2, output
    assert "Traceback" not in output, output
    errors = [line for line in output.splitlines() if line.startswith(f"{prog}: error:")]
    assert len(errors) == 1, output
    for fragment in fragments:
        assert fragment in errors[0], errors[0]


def test_server_wrong_type_is_one_line(tmp_path):
    result = _run([str(BIN / "hacfed-server"), "--config", str(SERVER_TOML), "--state-dir", str(tmp_path / "s"),
                   "--set", "sampling.temperature=hot"], tmp_path)
    _one_line_error(result, "hacfed-server", "SamplingParams.temperature must be a number > 0, got 'hot'")
    result = _run([str(BIN / "hacfed-server"), "--config", str(SERVER_TOML), "--nosuch-flag"], tmp_path)
    _one_line_error(result, "hacfed-server", "unrecognized arguments: --nosuch-flag")


def test_server_corrupt_journal_is_one_line(tmp_path):
    state = tmp_path / "s"
    state.mkdir()
    (state / "journal.sqlite").write_bytes(b"\x00garbage, not SQLite" * 64)
    result = _run([str(BIN / "hacfed-server"), "--config", str(SERVER_TOML), "--state-dir", str(state),
                   "--listen", "127.0.0.1:0", "--insecure"], tmp_path)
    _one_line_error(result, "hacfed-server", "journal.sqlite cannot be used: file is not a database",
                    "corrupt or not a hacfed journal")


def _client_argv(tmp_path: Path, *extra: str) -> list[str]:
    key = ensure_key_pair(tmp_path / "server", "coordinator").public
    return [str(BIN / "hacfed-client"), "--model", "tiny-llama", "--server", "127.0.0.1:9", "--participant-id",
            "lab-a", "--state-dir", str(tmp_path / "lab-a"), "--coordinator-key", str(key), "--insecure", *extra]


def test_client_wrong_types_are_one_line(tmp_path):
    _one_line_error(_run(_client_argv(tmp_path, "--lr", "hot"), tmp_path), "hacfed-client",
                    "argument --lr: invalid float value: 'hot'")
    _one_line_error(_run(_client_argv(tmp_path, "--task", "digits=hot"), tmp_path), "hacfed-client",
                    "'digits' must be int, got 'hot'")
    config = tmp_path / "lab.toml"
    config.write_text('[participant]\nlearning_rate = "hot"\n')
    _one_line_error(_run([*_client_argv(tmp_path), "--config", str(config)], tmp_path), "hacfed-client",
                    "ParticipantConfig.learning_rate must be a number > 0, got 'hot'")


def test_client_corrupt_outbox_is_one_line_before_the_model_loads(tmp_path):
    outbox = tmp_path / "lab-a" / "service" / "outbox.sqlite"
    outbox.parent.mkdir(parents=True)
    outbox.write_bytes(b"\x00garbage, not SQLite" * 64)
    result = _run(_client_argv(tmp_path), tmp_path)
    _one_line_error(result, "hacfed-client", "outbox.sqlite cannot be used: file is not a database")
    assert "loading model" not in result.stdout


def _read_only(directory: Path, argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Run argv with `directory` bind-mounted read-only in a private mount namespace (needs root)."""
    script = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
    return _run(["unshare", "-m", "sh", "-c", script, str(directory), *argv], cwd)


def _can_mount() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount --bind /tmp /tmp"], capture_output=True, check=False)
    return probe.returncode == 0


@pytest.mark.skipif(not _can_mount(), reason="needs unshare -m and mount (root) for a read-only bind mount")
def test_read_only_state_dirs_are_one_line(tmp_path):
    server_state = tmp_path / "s"
    server_state.mkdir()
    result = _read_only(server_state, [str(BIN / "hacfed-server"), "--config", str(SERVER_TOML), "--state-dir",
                                       str(server_state), "--listen", "127.0.0.1:0", "--insecure"], tmp_path)
    _one_line_error(result, "hacfed-server", "Read-only file system", "give a writable --state-dir")
    argv = _client_argv(tmp_path)
    (tmp_path / "lab-a").mkdir()
    _one_line_error(_read_only(tmp_path / "lab-a", argv, tmp_path), "hacfed-client", "Read-only file system")
    # an existing journal in a read-only state dir: the same one line
    server_ok = _run([str(BIN / "hacfed-server"), "audit", "verify", "--state-dir", str(server_state)], tmp_path)
    assert server_ok.returncode == 1 and "does not exist" in server_ok.stdout
