"""`hacfed sim` option handling: ablation overrides are typed, and bad input is a message, not a traceback."""

from __future__ import annotations

import pytest

from hacfed.tools import sim
from hacfed.tools.cli import main
from hacfed.tools.sim import SimConfig, participant_ids
from hacfed.tools.sim_cli import parse_hacpo_overrides


def test_hacpo_overrides_are_typed_by_the_config_defaults():
    assert parse_hacpo_overrides(["cross_clip=false", "alpha=2", "capability_window=3"]) == {
        "cross_clip": False, "alpha": 2.0, "capability_window": 3,
    }


@pytest.mark.parametrize("bad, match", [
    (["nosuch=1"], "KEY one of"), (["alpha=abc"], "alpha must be a float, got 'abc'"),
    (["cross_clip=maybe"], "true or false"), (["mode=gspo"], "KEY one of"), (["alpha"], "KEY=VALUE"),
])
def test_bad_overrides_name_the_problem(bad, match):
    with pytest.raises(ValueError, match=match):
        parse_hacpo_overrides(bad)


def test_cli_reports_bad_options_without_traceback(capsys):
    assert main(["sim", "--rounds", "0"]) == 2
    assert "rounds must be an int >= 1, got 0" in capsys.readouterr().err
    assert main(["sim", "--mode", "naive", "--hacpo", "stepwise_clip=false"]) == 2
    assert "only apply to modes ('hacpo', 'xhacpo')" in capsys.readouterr().err


def test_sim_config_validation_and_ids():
    with pytest.raises(ValueError, match="mode must be one of"):
        SimConfig(mode="ppo")
    assert participant_ids(["tiny-llama", "tiny-llama", "tiny-gpt2"]) == ["tiny-llama", "tiny-llama-2", "tiny-gpt2"]


@pytest.mark.parametrize("bad", [0, -4, True, 1.5, "96"])
def test_sim_minibatch_size_is_a_positive_int(bad):
    with pytest.raises(ValueError, match=f"minibatch_size must be an int >= 1, got {bad!r}"):
        SimConfig(minibatch_size=bad)
    assert SimConfig(minibatch_size=96).minibatch_size == 96


def test_cli_refuses_a_bad_minibatch_size_without_traceback(capsys):
    assert main(["sim", "--minibatch-size", "0"]) == 2
    err = capsys.readouterr().err
    assert "minibatch_size must be an int >= 1, got 0" in err and "Traceback" not in err


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2"])
def test_sim_peers_per_prompt_is_a_positive_int(bad):
    with pytest.raises(ValueError, match=f"peers_per_prompt must be an int >= 1, got {bad!r}"):
        SimConfig(peers_per_prompt=bad)


def test_cli_refuses_a_bad_peers_per_prompt_without_traceback(capsys):
    assert main(["sim", "--peers-per-prompt", "0"]) == 2
    err = capsys.readouterr().err
    assert "peers_per_prompt must be an int >= 1, got 0" in err and "Traceback" not in err


def coordinator_settings(monkeypatch, tmp_path, field: str, option: str, values: list) -> list:
    """The coordinator config's `field` when `hacfed sim` runs with SimConfig `option` set to each of
    `values` (stopped before any model is loaded)."""
    import hacfed.tools.sim as sim
    from hacfed.server.coordinator import config

    real = config.CoordinatorConfig
    seen = []

    class Stop(Exception):
        pass

    def record(**kwargs):
        seen.append(getattr(real(**kwargs), field))
        raise Stop

    monkeypatch.setattr(config, "CoordinatorConfig", record)
    for i, value in enumerate(values):
        with pytest.raises(Stop):
            sim.run_sim(SimConfig(rounds=1, state_dir=str(tmp_path / str(i)), **{option: value}), progress=False)
    return seen


def test_peers_per_prompt_reaches_the_coordinator(monkeypatch, tmp_path):
    """--peers-per-prompt K becomes the coordinator's pool_peers_per_prompt (what each agent is sent,
    `hacfed.server.coordinator.transport`); without it the coordinator keeps its default, 7."""
    seen = coordinator_settings(monkeypatch, tmp_path, "pool_peers_per_prompt", "peers_per_prompt", [1, None])
    assert seen == [1, 7]


def test_peer_choice_reaches_the_coordinator_and_a_bad_one_is_refused(monkeypatch, tmp_path, capsys):
    seen = coordinator_settings(monkeypatch, tmp_path, "pool_peer_choice", "peer_choice", ["successes", None])
    assert seen == ["successes", "drawn"]
    with pytest.raises(ValueError, match="peer_choice must be one of drawn, successes, got 'best'"):
        SimConfig(peer_choice="best")
    with pytest.raises(SystemExit):
        main(["sim", "--peer-choice", "best"])
    err = capsys.readouterr().err
    assert "invalid choice: 'best'" in err and "Traceback" not in err


def test_a_rows_evaluation_keys_are_pass1_and_the_halves_only():
    from hacfed.tools.sim import _eval_extras

    metrics = {"eval_pass1": 0.2, "eval_greedy/sym": 0.5, "eval_greedy/word": 0.1, "loss": 1.0, "time_eval_s": 3.0}
    assert _eval_extras(metrics) == {"eval_pass1": 0.2, "eval_greedy/sym": 0.5, "eval_greedy/word": 0.1}


def test_no_eval_start_drops_only_the_round_0_evaluation(capsys):
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Plan:
        round_id: int
        evaluate: bool

    @dataclass(frozen=True)
    class Update:
        next_plan: Plan | None

    class Inner:
        participant_id = "a"

        def __init__(self):
            self.seen = []

        def step(self, update):
            self.seen.append(update.next_plan)
            return None

    updates = [Update(Plan(0, True)), Update(Plan(3, True)), Update(None)]
    for eval_start, first in ((True, Plan(0, True)), (False, Plan(0, False))):
        inner = Inner()
        recorder = sim._Recorder(inner, eval_start=eval_start)
        for update in updates:
            recorder.exchange(update)
        assert inner.seen == [first, Plan(3, True), None]
    assert SimConfig().eval_start and main(["sim", "--no-eval-start", "--rounds", "0"]) == 2
    assert "rounds must be an int >= 1" in capsys.readouterr().err  # the flag parsed; the bad value named
