"""hacfed-server's configuration: TOML + --set + flags, validated with errors that name the field."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from hacfed.certs import init_federation_certs
from hacfed.config_values import parse_set
from hacfed.server.config import load_server_config, read_server_config, write_server_config
from hacfed.server.driver_settings import parse_supervisor
from hacfed.server.main import build_parser, main

BASE = """
run_id = "t"
rounds = 4
prompts_per_round = 2
group_size = 2
expected_participants = 2
min_participants = 1
round_deadline_s = 30
state_dir = "{state}"
[task]
kind = "arithmetic"
digits = 2
[sampling]
max_new_tokens = 6
[server]
listen = "127.0.0.1:9092"
insecure = true
"""


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "coordinator.toml"
    path.write_text(BASE.format(state=tmp_path / "state"))
    return path


def test_file_then_sets_then_flags(config_file: Path, tmp_path: Path) -> None:
    cfg = load_server_config(config_file, ["rounds=7", "task.digits=3", "sampling.max_new_tokens=9",
                                           "hacpo.mode=naive", "run_id=demo", "server.listen=127.0.0.1:0"],
                             {"state_dir": str(tmp_path / "other"), "listen": "localhost:5000"})
    assert cfg.coordinator.rounds == 7 and dict(cfg.coordinator.task) == {"kind": "arithmetic", "digits": 3}
    assert cfg.coordinator.sampling.max_new_tokens == 9 and cfg.coordinator.hacpo.mode == "naive"
    assert cfg.coordinator.run_id == "demo"
    assert cfg.server.listen == "localhost:5000"  # the flag wins over --set server.listen
    assert cfg.state_dir == tmp_path / "other" and cfg.state_dir.is_absolute()
    assert cfg.keys_dir == tmp_path / "other" / "keys" and cfg.metrics_out == tmp_path / "other" / "metrics.jsonl"
    assert cfg.config_dir == config_file.parent


@pytest.mark.parametrize(
    ("sets", "flags", "message"),
    [
        (["rounds=0"], {}, "CoordinatorConfig.rounds must be an integer >= 1, got 0"),
        (["round_join=sometimes"], {}, "CoordinatorConfig.round_join must be one of 'every', 'newest'"),
        (["min_participants=5"], {}, "CoordinatorConfig.min_participants must be <= expected_participants"),
        (["round_deadline_s=-1"], {}, "CoordinatorConfig.round_deadline_s"),
        (["server.listen=nowhere"], {}, "server.listen must be HOST:PORT"),
        (["server.poll_interval_s=0"], {}, "server.poll_interval_s must be a number > 0"),
        (["server.colour=blue"], {}, r"\[server\]: unknown key\(s\) \['colour'\]"),
        (["bogus=1"], {}, r"unknown coordinator config key\(s\): \['bogus'\]"),
        (["max_staleness=999"], {}, r"max_staleness = 999: must be at most rounds - 1 = \d+"),
        (["max_staleness=-1"], {}, "max_staleness must be an integer >= 0, got -1"),
        (["norvalue"], {}, "--set expects KEY=VALUE"),
        ([], {"listen": "0.0.0.0:9092"}, "server.listen: --insecure binds loopback only"),
        ([], {"listen": "10.1.2.3:9092"}, "server.listen: --insecure binds loopback only"),
        (["server.insecure=false"], {}, "pass --insecure .* or all of --tls-cert, --tls-key and --tls-ca"),
        ([], {"tls_cert": "missing.pem", "tls_key": "k", "tls_ca": "c"},
         "server.tls_cert: .*missing.pem is not a file"),
        (["server.insecure=false"], {"trust_on_first_use": True, "tls_cert": __file__, "tls_key": __file__,
                                     "tls_ca": __file__}, "trust_on_first_use .* only with --insecure"),
    ],
)
def test_errors_name_the_field(config_file: Path, sets: list[str], flags: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_server_config(config_file, sets, flags)


def test_max_staleness_up_to_rounds_minus_one(config_file: Path) -> None:
    """hacfed-server runs bounded staleness over Flower: K from 0 to rounds - 1 (every round open at once)."""
    for k in (0, 1, 3):
        assert load_server_config(config_file, [f"max_staleness={k}"]).coordinator.max_staleness == k


def test_tls_flags_replace_the_files_plaintext_setting(config_file: Path, tmp_path: Path) -> None:
    certs = init_federation_certs(tmp_path / "certs", ["coordinator.example"])
    cfg = load_server_config(config_file, [], {"listen": "0.0.0.0:9092", "tls_cert": str(certs.server_cert),
                                               "tls_key": str(certs.server_key), "tls_ca": str(certs.ca_cert)})
    assert cfg.server.insecure is False and cfg.server.tls_cert == certs.server_cert.resolve()


def test_tls_files_that_do_not_fit_are_refused_at_load(config_file: Path, tmp_path: Path) -> None:
    ours, foreign = init_federation_certs(tmp_path / "ours", []), init_federation_certs(tmp_path / "foreign", [])
    flags = {"listen": "0.0.0.0:9092", "tls_cert": str(foreign.server_cert), "tls_key": str(foreign.server_key),
             "tls_ca": str(ours.ca_cert)}
    with pytest.raises(ValueError, match="was not issued by the CA"):
        load_server_config(config_file, [], flags)


def test_state_dir_is_required_somewhere(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(BASE.format(state="x").replace('state_dir = "x"\n', ""))
    with pytest.raises(ValueError, match="state_dir: set it in the config file or pass --state-dir"):
        load_server_config(path)
    assert load_server_config(path, [], {"state_dir": str(tmp_path / "s")}).state_dir == tmp_path / "s"


def test_parse_set_reads_toml_values_and_plain_strings() -> None:
    assert parse_set("rounds=3") == ("rounds", 3)
    assert parse_set("x=0.5") == ("x", 0.5)
    assert parse_set("flag=true") == ("flag", True)
    assert parse_set("run_id=demo-1") == ("run_id", "demo-1")
    assert parse_set('name="a b"') == ("name", "a b")


def test_every_option_is_explained_in_help() -> None:
    parser = build_parser()
    options = [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]
    assert {o.dest for o in options} >= {"config", "sets", "state_dir", "listen", "insecure", "tls_cert", "tls_key",
                                         "tls_ca", "keys_dir", "metrics_out", "trust_on_first_use"}
    assert all(o.help and len(o.help) > 15 for o in options)
    assert all("(default: " in o.help or o.help.startswith("required: ") for o in options), \
        [o.dest for o in options if "(default: " not in o.help and not o.help.startswith("required: ")]


def test_the_help_names_the_real_default_listen_address() -> None:
    from hacfed.server import main as server_main
    from hacfed.server.config import DEFAULT_LISTEN, ServerSettings

    assert server_main.DEFAULT_LISTEN == DEFAULT_LISTEN == ServerSettings.__dataclass_fields__["listen"].default
    assert f"else {DEFAULT_LISTEN})" in next(a.help for a in build_parser()._actions if a.dest == "listen")


def test_main_reports_config_errors_without_a_traceback(config_file: Path, capsys: pytest.CaptureFixture) -> None:
    code = main(["--config", str(config_file), "--insecure", "--listen", "0.0.0.0:9092"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("hacfed-server: error: server.listen: --insecure binds loopback only")
    assert "Traceback" not in err
    assert main(["--config", str(config_file.parent / "nope.toml")]) == 2
    assert "config file not found" in capsys.readouterr().err


def test_insecure_flag_replaces_the_files_tls_settings(tmp_path):
    """deploy/coordinator.toml names TLS files; its documented `--insecure` development command must
    load (it said: --insecure and the TLS files exclude each other)."""
    deploy = Path(__file__).resolve().parents[2] / "deploy" / "coordinator.toml"
    cfg = load_server_config(deploy, [], {"state_dir": str(tmp_path), "insecure": True})
    assert cfg.server.insecure is True and cfg.server.tls_cert is None and cfg.listen[0] == "127.0.0.1"


def test_the_serverapp_reads_back_the_config_hacfed_server_loaded(config_file: Path, tmp_path: Path) -> None:
    certs = init_federation_certs(tmp_path / "certs", [])
    cfg = load_server_config(config_file,
                             ["rounds=7", "task.digits=3", "hacpo.mode=naive", "server.dashboard=127.0.0.1:0"],
                             {"insecure": False, "tls_cert": str(certs.server_cert), "tls_key": str(certs.server_key),
                              "tls_ca": str(certs.ca_cert), "metrics_out": "m.jsonl"})
    path = write_server_config(cfg, tmp_path / "state" / "driver-settings.json")
    again = read_server_config(path)
    assert again == cfg
    assert again.coordinator.rounds == 7 and again.server.tls_ca == certs.ca_cert.resolve()
    assert again.supernode_auth and again.coordinator_key == tmp_path / "state" / "coordinator.key"


@pytest.mark.parametrize(
    ("section", "key", "value", "message"),
    [
        ("coordinator", "rounds", 0, "CoordinatorConfig.rounds must be an integer >= 1, got 0"),
        ("server", "poll_interval_s", 0, "server.poll_interval_s must be a number > 0, got 0"),
        ("server", "listen", "0.0.0.0:1", "server.listen: --insecure binds loopback only"),
        ("server", "polls", 1, r"\[server\]: unknown key\(s\) \['polls'\]"),
    ],
)
def test_the_serverapp_validates_by_the_same_rules(config_file: Path, tmp_path: Path, section: str, key: str,
                                                   value: object, message: str) -> None:
    path = write_server_config(load_server_config(config_file), tmp_path / "s.json")
    data = json.loads(path.read_text())
    data[section][key] = value
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=message):
        read_server_config(path)
    path.write_text("{")
    with pytest.raises(ValueError, match="server config .* unreadable"):
        read_server_config(path)


def test_the_supervisor_in_the_run_config_is_a_pid_and_its_start_time() -> None:
    assert parse_supervisor("12:345") == (12, 345) and parse_supervisor("") is None
    for bad in ("12", "x:1", "0:5", 7):
        with pytest.raises(ValueError, match=f"run config 'supervisor' must be 'PID:TICKS' or empty, got {bad!r}"):
            parse_supervisor(bad)
