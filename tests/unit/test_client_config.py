"""hacfed-client's configuration: TOML + flags + --task, validated with errors that name the field."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from hacfed.clients.config import DEFAULT_TASK, PARTICIPANT_KEYS, load_client_config, setting_names
from hacfed.clients.main import NAMES, build_parser, main
from hacfed.clients.participant_config import ParticipantConfig
from hacfed.clients.runner import BUDGET_SETTING, Client, describe_answer
from hacfed.clients.service import Answered
from hacfed.keys import ensure_key_pair
from hacfed.messages import RoundUpdate, StepReport, Submission


@pytest.fixture
def flags(tmp_path: Path) -> dict:
    key = ensure_key_pair(tmp_path / "server", "coordinator").public
    return {"participant_id": "lab-a", "model": "tiny-llama", "server": "127.0.0.1:9092",
            "state_dir": str(tmp_path / "lab-a"), "coordinator_key": str(key), "insecure": True}


def test_flags_alone_give_the_default_task(flags: dict, tmp_path: Path) -> None:
    cfg = load_client_config(None, flags)
    assert cfg.task == DEFAULT_TASK and cfg.state_dir == tmp_path / "lab-a"
    lab = cfg.participant  # the lab's training choices: ParticipantConfig's defaults where unset
    assert lab == ParticipantConfig("lab-a", "tiny-llama", checkpoint_dir=str(tmp_path / "lab-a" / "checkpoints"))
    assert cfg.participant_id == "lab-a" and cfg.model == "tiny-llama"


def test_file_then_flags_then_task_items(flags: dict, tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text('[participant]\nmodel = "tiny-gpt2"\nfinetune = "lora"\nlearning_rate = 1e-4\n'
                    '[task]\nkind = "arithmetic"\ndigits = 2\noperators = "+"\n')
    cfg = load_client_config(path, {**flags, "model": None, "device": "cpu"}, ["digits=3"])
    assert cfg.model == "tiny-gpt2" and cfg.participant.finetune == "lora" and cfg.participant.learning_rate == 1e-4
    assert cfg.participant.device == "cpu"
    assert cfg.task == {"kind": "arithmetic", "digits": 3, "operators": "+"} and cfg.config_dir == tmp_path


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"participant_id": "../etc"}, "ClientConfig.participant_id must be 1-63 characters of a-z"),
        ({"participant_id": "Lab-A"}, "ClientConfig.participant_id must be 1-63 characters of a-z"),
        ({"participant_id": "lab a"}, "ClientConfig.participant_id must be 1-63 characters of a-z"),
        ({"server": "10.1.2.3:9092"}, "ClientConfig.insecure must be false for the non-loopback server"),
        ({"server": "coordinator.example:9092"}, "ClientConfig.insecure must be false for the non-loopback server"),
        ({"insecure": False, "tls_ca": __file__}, "is not a PEM certificate"),
        ({"server": "nowhere"}, "ClientConfig.server must be HOST:PORT"),
        ({"coordinator_key": "missing.pub"}, r"ClientConfig.coordinator_key: the file '\S*missing.pub' does not exist; "
                                             "give the coordinator's public key file, coordinator.pub"),
        ({"insecure": None}, "ClientConfig.insecure must be true without tls_ca"),
        ({"tls_ca": __file__}, "ClientConfig.insecure must be true without tls_ca"),
        ({"participant_id": ""}, "ParticipantConfig.participant_id must be a non-empty string, got ''"),
        ({"model": 3}, "ParticipantConfig.model must be a non-empty string, got 3"),
        ({"finetune": "half"}, r"ParticipantConfig.finetune must be one of \['full', 'lora', 'auto'\], got 'half'"),
        ({"device": ""}, "ParticipantConfig.device must be a torch device such as cpu or cuda:0, got ''"),
        ({"rollout_backend": "tgi"}, "ParticipantConfig.rollout_backend must be one of"),
        ({"learning_rate": -1.0}, "ParticipantConfig.learning_rate must be a number > 0, got -1.0"),
        ({"learning_rate": float("nan")}, "ParticipantConfig.learning_rate must be a number > 0, got nan"),
        ({"learning_rate": True}, "ParticipantConfig.learning_rate must be a number > 0, got True"),
        ({"lora_rank": 2.5}, "ParticipantConfig.lora_rank must be an integer >= 1, got 2.5"),
        ({"eval_problems": 0}, "ParticipantConfig.eval_problems must be an integer >= 1, got 0"),
        ({"minibatch_size": 0}, r"ParticipantConfig.minibatch_size must be an integer >= 1 \(or unset\), got 0"),
        ({"minibatch_size": True}, r"ParticipantConfig.minibatch_size must be an integer >= 1 \(or unset\), got True"),
        ({"seed": -1}, "ParticipantConfig.seed must be an integer >= 0, got -1"),
        ({"seed": False}, "ParticipantConfig.seed must be an integer >= 0, got False"),
        ({"keep_checkpoints": 1}, "ParticipantConfig.keep_checkpoints must be an integer >= 2, got 1"),
        ({"nproc": 65}, r"ParticipantConfig.nproc must be an integer in 1..64, got 65"),
        ({"nproc": 2, "rollout_backend": "vllm"}, "ParticipantConfig.nproc must be 1 with rollout_backend 'vllm'"),
        ({"stay": 1}, "ClientConfig.stay must be true or false, got 1"),
        ({"model": None}, r"missing setting\(s\) \['model'\]: pass --model"),
    ],
)
def test_errors_name_the_field(flags: dict, changes: dict, message: str) -> None:
    values = {**flags, **changes}
    if changes.get("model", "") is None:
        values.pop("model")
    with pytest.raises(ValueError, match=message):
        load_client_config(None, values)


def test_insecure_client_is_refused_for_a_non_loopback_server(flags: dict) -> None:
    """issue 9, reproduction 7: the client used to accept --insecure for any server."""
    with pytest.raises(ValueError, match="plaintext .* is a development mode for 127.0.0.1 only"):
        load_client_config(None, {**flags, "server": "192.0.2.10:9092"})
    assert load_client_config(None, {**flags, "server": "localhost:9092"}).insecure


def test_tls_client_needs_a_valid_federation_ca(flags: dict, tmp_path: Path) -> None:
    from hacfed.certs import init_federation_certs

    certs = init_federation_certs(tmp_path / "certs", [])
    tls = {**flags, "insecure": None, "server": "coordinator.example:9092"}
    assert load_client_config(None, {**tls, "tls_ca": str(certs.ca_cert)}).tls_ca == certs.ca_cert
    with pytest.raises(ValueError, match="is not a CA certificate"):
        load_client_config(None, {**tls, "tls_ca": str(certs.server_cert)})


def test_unknown_keys_and_tables_are_refused(flags: dict, tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text("[participant]\nmodle = 'x'\n")
    with pytest.raises(ValueError, match=r"\[participant\]: unknown key\(s\) \['modle'\]") as refused:
        load_client_config(path, flags)
    assert f"known: {setting_names()}" in str(refused.value)
    path.write_text("[participant]\ncheckpoint_dir = 'x'\n")  # always STATE/checkpoints
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['checkpoint_dir'\]"):
        load_client_config(path, flags)
    path.write_text("[server]\nlisten = 'x'\n")
    with pytest.raises(ValueError, match=r"unknown table\(s\) \['server'\]"):
        load_client_config(path, flags)


def test_every_option_is_explained_in_help() -> None:
    options = [a for a in build_parser()._actions if not isinstance(a, argparse._HelpAction)]
    assert {o.dest for o in options} >= {"model", "server", "participant_id", "state_dir", "coordinator_key",
                                         "insecure", "tls_ca", "finetune", "device", "rollout_backend",
                                         "learning_rate", "stay", "task_sets"}
    shown = [o for o in options if o.help != argparse.SUPPRESS]
    assert all(o.help and len(o.help) > 15 for o in shown)
    assert all("(default: " in o.help or o.help.startswith("required: ") for o in shown), \
        [o.dest for o in shown if "(default: " not in o.help and not o.help.startswith("required: ")]


def test_help_defaults_are_the_real_defaults() -> None:
    import re

    from hacfed.clients.config import ClientConfig

    helps = {a.dest: a.help for a in build_parser()._actions}
    shown = {dest: re.search(r"\(default: ([^;)]+)", text).group(1) for dest, text in helps.items()
             if text and "(default: " in text}
    fields = {f.name: f.default for f in dataclasses.fields(ParticipantConfig)}
    for dest in ("learning_rate", "lora_rank", "eval_problems", "finetune", "device", "rollout_backend", "seed",
                 "nproc"):
        assert shown[dest] == str(fields[dest]), (dest, shown[dest], fields[dest])
    assert ClientConfig.__dataclass_fields__["stay"].default is False and shown["stay"].startswith("off")
    assert "kind=arithmetic digits=2 operators=+" in helps["task_sets"]
    assert DEFAULT_TASK == {"kind": "arithmetic", "digits": 2, "operators": "+"}


def test_one_flat_table_fills_both_configs(flags: dict, tmp_path: Path) -> None:
    """Every flag is a [participant] key; the lab's training keys land in its ParticipantConfig, once."""
    assert set(NAMES) <= set(setting_names())
    assert set(PARTICIPANT_KEYS) <= {f.name for f in dataclasses.fields(ParticipantConfig)}
    path = tmp_path / "p.toml"
    path.write_text("[participant]\nlora_rank = 4\nminibatch_size = 6\nseed = 7\nkeep_checkpoints = 5\n"
                    "nproc = 2\neval_problems = 9\nidle_poll_s = 0.25\n")
    cfg = load_client_config(path, flags)
    lab = cfg.participant
    assert (lab.lora_rank, lab.minibatch_size, lab.seed, lab.keep_checkpoints, lab.nproc, lab.eval_problems) == \
        (4, 6, 7, 5, 2, 9)
    assert cfg.idle_poll_s == 0.25 and not hasattr(cfg, "seed") and not hasattr(cfg, "nproc")


def test_exit_when_done_is_still_accepted_and_changes_nothing() -> None:
    args = build_parser().parse_args(["--exit-when-done"])
    assert args.exit_when_done is True and args.stay is None


def test_main_reports_config_errors_without_a_traceback(flags: dict, capsys: pytest.CaptureFixture) -> None:
    code = main(["--model", "tiny-llama", "--server", "127.0.0.1:1", "--participant-id", "lab-a", "--state-dir",
                 flags["state_dir"], "--coordinator-key", flags["coordinator_key"]])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("hacfed-client: error: ClientConfig.insecure") and "Traceback" not in err


def test_progress_lines_say_what_the_step_did() -> None:
    from hacfed.server.coordinator.plan import make_plan
    from tests.unit.test_coordinator_fakes import TASK, make_config, scripted_trajectories

    plan = make_plan(make_config(Path("/tmp")), TASK, 1)
    pool = tuple(scripted_trajectories(plan, "lab-a") + scripted_trajectories(plan, "lab-b"))
    update = RoundUpdate("test-run", 0, pool, {"lab-a": 0.5}, plan)
    sub = Submission("test-run", "lab-a", 1, pool[:6], StepReport("lab-a", 1, {"time_training_s": 1.5,
                                                                               "time_rollout_s": 0.5}, 0.25))
    line = describe_answer(Answered(update, sub, 2.0, False), "lab-a")
    assert line.startswith("round 1: trained on 12 pooled samples of round 0 (6 from other labs) in 1.5s")
    assert "eval accuracy 0.250" in line and "rolled out 6 in 0.5s, claimed reward 0.33" in line
    assert "cached reply" in describe_answer(Answered(update, None, 0.0, True), "lab-a")
    assert "cut at" not in line
    cut = Submission("test-run", "lab-a", 1, pool[:6], StepReport("lab-a", 1, {"rollout_truncated_frac": 0.5}, None))
    described = describe_answer(Answered(update, cut, 2.0, False), "lab-a")
    assert "claimed reward 0.33, 50% cut at the response budget" in described


def test_the_client_warns_when_most_responses_are_cut_at_the_budget_once_and_again_when_worse(
        flags: dict, capsys: pytest.CaptureFixture) -> None:
    """hacfed-client says what hacfed sim says (hacfed.metrics_sinks.TruncationWarnings) when its
    rollouts are cut at the plan's response budget: once, and again when the fraction grew (issue 43)."""
    from hacfed.server.coordinator.plan import make_plan
    from tests.unit.test_coordinator_fakes import TASK, make_config

    plan = make_plan(make_config(Path("/tmp")), TASK, 1)
    update = RoundUpdate("test-run", 0, (), {}, plan)
    client = Client(load_client_config(None, flags))
    warnings = []
    for cut in (0.05, 0.62, 0.66, 0.94, 0.94):
        report = StepReport("lab-a", 1, {"rollout_truncated_frac": cut}, None)
        client.on_answer(Answered(update, Submission("test-run", "lab-a", 1, (), report), 1.0, False))
        warnings += [line for line in capsys.readouterr().out.splitlines() if "warning:" in line]
    assert warnings == [
        f"hacfed-client: warning: lab-a: 62% of its responses were cut at the response budget (finish reason "
        f"'length'); their rewards score unfinished answers: raise {BUDGET_SETTING}",
        f"hacfed-client: warning: lab-a: 94% of its responses were cut at the response budget (up from 62%) "
        f"(finish reason 'length'); their rewards score unfinished answers: raise {BUDGET_SETTING}"]


def test_the_insecure_flag_replaces_the_files_tls_ca_and_the_reverse(flags: dict, tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text('[participant]\ntls_ca = "missing-ca.pem"\n')
    cfg = load_client_config(path, flags)  # flags has insecure=True
    assert cfg.insecure and cfg.tls_ca is None
    path.write_text("[participant]\ninsecure = true\n")
    with pytest.raises(ValueError, match="ClientConfig.tls_ca must be an existing CA certificate"):
        load_client_config(path, {**flags, "insecure": None, "tls_ca": str(tmp_path / "nope.pem")})


def test_a_lab_can_evaluate_on_the_validation_split(flags: dict, tmp_path: Path) -> None:
    """Choosing a lab's settings without the test problems: --eval-split / [participant] eval_split."""
    assert load_client_config(None, {**flags, "eval_split": "validation"}).participant.eval_split == "validation"
    assert build_parser().parse_args(["--eval-split", "validation"]).eval_split == "validation"
    path = tmp_path / "lab.toml"
    path.write_text('[participant]\neval_split = "validation"\n')
    assert load_client_config(path, flags).participant.eval_split == "validation"


def test_a_refused_lab_keeps_its_supernode_up_a_while_after_the_answer_left(flags: dict) -> None:
    """A SuperNode that stops takes the replies the coordinator has not pulled with it: the answer that
    tells the coordinator this lab is on another task became "node unavailable" and every round waited
    for the lab until its deadline (the example task's README run, long tier). Once the answer has left,
    the lab stays up REFUSAL_LINGER_S more (an earlier answer's "Sent successfully" does not count)."""
    from hacfed.clients import runner

    client = Client(load_client_config(None, flags))
    log = client.cfg.state_dir / "supernode" / "supernode.log"
    log.parent.mkdir(parents=True)
    log.write_text("INFO: Sending: query.hello message\nINFO: Sent successfully\n")  # an earlier answer
    client.on_refused("task mismatch: plan prompt 'x' is unknown to this client's task arith-add2")
    with open(log, "a") as fh:
        fh.write("INFO: Sending: train.exchange message\nINFO: Sent successfully\n")  # the refusal's answer
    slept: list[float] = []
    client.leave_after_refusal(sleep=slept.append)
    assert slept == [runner.REFUSAL_LINGER_S] and runner.REFUSAL_LINGER_S >= 5.0
