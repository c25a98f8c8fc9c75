"""Progress bars only on a terminal: in a log or a pipe the entry points switch off transformers',
huggingface_hub's and tqdm's default bars, for themselves and the processes they start."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hacfed import progress

CHECK = """
from hacfed.progress import bars_only_on_a_terminal
print(bars_only_on_a_terminal())
import tqdm
from transformers.utils import logging
print(logging.is_progress_bar_enabled(), tqdm.tqdm(range(3)).disable)
"""


def test_in_a_pipe_the_bars_of_transformers_and_tqdm_are_off() -> None:
    drop = ("HF_HUB_DISABLE_PROGRESS_BARS", "TQDM_DISABLE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "False", "True"]
    assert out.stderr == ""  # no bar was drawn


def test_on_a_terminal_nothing_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    assert progress.bars_only_on_a_terminal() is True
    assert "TQDM_DISABLE" not in os.environ


def test_a_users_own_setting_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TQDM_DISABLE", "0")
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    assert progress.bars_only_on_a_terminal() is False
    assert os.environ["TQDM_DISABLE"] == "0" and os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"


class _Stop(Exception):
    pass


@pytest.mark.parametrize("tty", [False, True])
def test_a_preset_warm_up_draws_its_bar_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch, tty: bool) -> None:
    """`load_model` of a preset that is not built yet hands the warm-up `progress` = on a terminal
    (a `hacfed sim` run logged to a file showed the warm-up's bar, which passes `disable` itself)."""
    from hacfed.models import loading

    seen = []

    def fake_ensure_built(spec, *, progress):
        seen.append(progress)
        raise _Stop

    monkeypatch.setattr(loading, "ensure_built", fake_ensure_built)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: tty, raising=False)
    with pytest.raises(_Stop):
        loading.load_model("tiny-llama")
    assert seen == [tty]
