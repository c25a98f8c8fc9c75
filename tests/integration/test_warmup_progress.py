"""hacfed demo's warm-ups, for real: a preset built on first use says what it waits for, counts its
steps against an honest estimate (not its 1500-step cap), and ends with a "ready" line; a cached one
says "ready (cached)". tiny-llama is built in a fresh HACFED_HOME without its shipped copy (about a
minute on one core)."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.slow


def test_a_first_warm_up_reports_an_honest_estimate_and_a_ready_line(tmp_path, monkeypatch, capsys):
    import torch

    import hacfed.models.warmup as warmup_module
    from hacfed.models import shipped, store
    from hacfed.tools.demo import prepare_agent

    monkeypatch.setenv("HACFED_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(shipped, "SHIPPED_ROOT", tmp_path / "nothing-shipped")  # a real warm-up, not the copy
    monkeypatch.setattr(warmup_module, "PLAIN_PROGRESS_EVERY_S", 0.0)  # its plain line at every step
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        prepare_agent(store, "tiny-llama")
        first = capsys.readouterr()
        prepare_agent(store, "tiny-llama")
        again = capsys.readouterr()
    finally:
        torch.set_num_threads(threads)
    out = first.out.splitlines()
    assert out[0] == "[demo] tiny-llama: building and warming up (first use; it stops when held-out accuracy " \
                     "reaches 0.35)"
    ready = re.fullmatch(r"\[demo\] tiny-llama ready: held-out accuracy (0\.\d\d) after (\d+) warm-up steps \(\d+ s\)",
                         out[-1])
    assert ready and float(ready.group(1)) >= 0.35, out
    steps = int(ready.group(2))
    progress = re.findall(r"warm-up tiny-llama: step (\d+), .*?, (?:about (\d+) steps in all|no estimate)",
                          first.err)
    assert len(progress) == steps and "at most" not in first.err, first.err[-2000:]
    estimates = [(int(step), int(total)) for step, total in progress if total]
    assert estimates, first.err[-2000:]
    late = [total for step, total in estimates if step >= steps / 3]  # from a third of the way on
    assert all(steps / 2 <= total <= steps * 2 for total in late), (steps, late)
    assert again.out == "[demo] tiny-llama ready (cached): held-out accuracy " + ready.group(1) + "\n"
