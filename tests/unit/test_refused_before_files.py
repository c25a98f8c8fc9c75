"""A mistaken hacfed-client or hacfed-server command is refused with one line before it creates any
key, lock or folder: nothing to clean up, nothing half-registered."""

from __future__ import annotations

from pathlib import Path

import pytest

from hacfed.clients.main import main as client_main
from hacfed.keys import ensure_key_pair
from hacfed.server.main import main as server_main
from tests.unit.test_server_config import BASE


@pytest.fixture
def lab(tmp_path: Path) -> dict[str, Path]:
    not_a_key = tmp_path / "not-a-key.pub"
    not_a_key.write_text("hello\n")
    return {"state": tmp_path / "lab-a", "key": ensure_key_pair(tmp_path / "server", "coordinator").public,
            "not_a_key": not_a_key}


def _client_argv(lab: dict[str, Path], **changes: str) -> list[str]:
    flags = {"model": "tiny-llama", "server": "127.0.0.1:9092", "participant-id": "lab-a",
             "state-dir": str(lab["state"]), "coordinator-key": str(lab["key"]), "insecure": None}
    flags.update({k.replace("_", "-"): v for k, v in changes.items()})
    argv: list[str] = []
    for flag, value in flags.items():
        if value != "DROP":
            argv += [f"--{flag}"] + ([] if value is None else [value])
    return argv


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"model": "no-such-model"}, "ClientConfig.model: unknown model 'no-such-model': expected a preset"),
        ({"model": "someorg/not-cached"}, "is not in the local Hugging Face cache"),
        ({"server": "127.0.0.1:0"}, "ClientConfig.server must be the coordinator's HOST:PORT with a port in 1-65535"),
        ({"server": "127.0.0.1:99999"}, "ClientConfig.server must be HOST:PORT with a port in 0-65535"),
        ({"participant_id": "../lab"}, "ClientConfig.participant_id must be 1-63 characters"),
        ({"coordinator_key": "NOT_A_KEY"}, "ClientConfig.coordinator_key must be the coordinator's public key file"),
        ({"insecure": "DROP", "tls_ca": "missing-ca.pem"}, "ClientConfig.tls_ca must be an existing CA certificate"),
        ({"task": "kind=nope"}, "task spec: unknown kind 'nope'"),
        ({"task": "digits=0"}, "digits"),
        ({"seed": "-1"}, "ParticipantConfig.seed must be an integer >= 0"),
    ],
)
def test_client_refuses_before_creating_anything(lab: dict[str, Path], changes: dict[str, str], message: str,
                                                 capsys: pytest.CaptureFixture,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(lab["state"].parent / "hub"))
    changes = {k: (str(lab["not_a_key"]) if v == "NOT_A_KEY" else v) for k, v in changes.items()}
    code = client_main(_client_argv(lab, **changes))
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("hacfed-client: error: ") and message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert not lab["state"].exists()  # no key, no lock, no folder
    assert not (lab["state"].parent / "hub").exists()


def test_a_state_dir_that_is_a_file_is_refused(lab: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    lab["state"].write_text("")
    assert client_main(_client_argv(lab)) == 2
    assert "ClientConfig.state_dir must be a directory (it is a file)" in capsys.readouterr().err


@pytest.fixture
def server_config(tmp_path: Path) -> Path:
    path = tmp_path / "coordinator.toml"
    path.write_text(BASE.format(state=tmp_path / "state"))
    return path


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "task.kind=nope"], "unknown kind 'nope'"),
        (["--set", "task.digits=0"], "digits"),
        (["--set", "rounds=0"], "rounds"),
        (["--listen", "0.0.0.0:9092"], "--insecure binds loopback only"),
        (["--listen", "nowhere"], "server.listen must be HOST:PORT"),
        (["--tls-cert", "c.pem", "--tls-key", "k.pem", "--tls-ca", "ca.pem"], "server.tls_cert:"),
        (["--set", "run_id="], "run_id"),
    ],
)
def test_server_refuses_before_creating_anything(server_config: Path, args: list[str], message: str,
                                                 capsys: pytest.CaptureFixture) -> None:
    code = server_main(["--config", str(server_config), *args])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("hacfed-server: error: ") and message in err and "Traceback" not in err
    assert not (server_config.parent / "state").exists()


def test_server_state_dir_that_is_a_file_is_refused(server_config: Path, capsys: pytest.CaptureFixture) -> None:
    (server_config.parent / "state").write_text("")
    assert server_main(["--config", str(server_config)]) == 2
    assert "the state dir" in capsys.readouterr().err
    assert (server_config.parent / "state").read_text() == ""


def test_server_refuses_a_task_whose_data_file_is_missing(server_config: Path, capsys: pytest.CaptureFixture) -> None:
    text = server_config.read_text().replace('kind = "arithmetic"\ndigits = 2', 'kind = "jsonl"\n'
                                             'train_files = ["missing.jsonl"]\neval_files = ["missing.jsonl"]')
    server_config.write_text(text)
    assert server_main(["--config", str(server_config)]) == 2
    assert "file not found" in capsys.readouterr().err
    assert not (server_config.parent / "state").exists()
