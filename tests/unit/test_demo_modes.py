"""`hacfed demo --mode`: every named mode of `hacfed sim` reaches the coordinator's config intact."""

from __future__ import annotations

import argparse

import pytest

from hacfed.hacpo_config import HacpoConfig
from hacfed.server.coordinator.config import load_coordinator_config
from hacfed.tools.demo import DEMO_MODE, write_server_config
from hacfed.tools.modes import MODE_NAMES, hacpo_config_for


@pytest.mark.parametrize("mode", MODE_NAMES)
def test_demo_server_config_carries_the_named_mode(tmp_path, mode):
    args = argparse.Namespace(rounds=3, prompts_per_round=4, group_size=4, eval_every=1, seed=0, mode=mode)
    path = write_server_config(tmp_path / "server.toml", args, 2, tmp_path / "state")
    cfg = load_coordinator_config(path)
    assert cfg.hacpo == hacpo_config_for(mode)  # every setting of the mode, paper defaults elsewhere
    assert cfg.group_size == (8 if mode == "gspo2" else 4)  # GSPO×2 samples 2G per prompt


def test_demo_default_mode_is_the_recommended_one_not_the_paper_default():
    assert DEMO_MODE == "xhacpo" and hacpo_config_for(DEMO_MODE) != HacpoConfig()


def test_demo_refuses_an_unknown_mode(capsys):
    from hacfed.tools.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["demo", "--mode", "hacpo-typo"])
    assert exc.value.code == 2
    assert "invalid choice: 'hacpo-typo'" in capsys.readouterr().err
