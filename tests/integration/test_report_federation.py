"""A real small federation (`hacfed demo`: hacfed-server + two hacfed-client over Flower, TLS) with
--tensorboard, then `hacfed report` on its state dir: the HTML has both labs, one image per chart and
the journal's codes section; each lab's TensorBoard tags are its own STATE/metrics.jsonl keys."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from hacfed.metrics_sinks import scalar_items

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
LABS = ("lab-a-llama", "lab-b-gpt2")


def test_report_and_tensorboard_of_a_real_federation(tmp_path: Path, zoo_presets: Callable[..., None]) -> None:
    pytest.importorskip("tensorboard")
    zoo_presets("tiny-llama", "tiny-gpt2")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    state, tb = tmp_path / "state", tmp_path / "tb"
    demo = subprocess.run(
        [str(BIN / "hacfed"), "demo", "--agents", "tiny-llama,tiny-gpt2", "--rounds", "3", "--prompts-per-round", "2",
         "--group-size", "2", "--eval-every", "2", "--state-dir", str(state), "--metrics-out",
         str(state / "metrics.jsonl"), "--plot", str(tmp_path / "acc.png"), "--tensorboard", str(tb)],
        capture_output=True, text=True, timeout=1200, start_new_session=True, env=dict(os.environ),
    )
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]

    out = tmp_path / "report.html"
    report = subprocess.run([str(BIN / "hacfed"), "report", str(state), "--out", str(out)],
                            capture_output=True, text=True, timeout=600)
    assert report.returncode == 0, report.stderr
    page = out.read_text(encoding="utf-8")
    charts = int(re.search(r"\((\d+) charts\)", report.stdout).group(1))
    assert page.count('<img alt="') == len(re.findall(r'src="data:image/png;base64,', page)) == charts >= 6
    for lab in LABS:
        assert f"<section class='lab' id='lab-{lab}'>" in page
    assert str(state / "coordinator" / "journal.sqlite") in page  # codes come from the real journal
    assert "The journal records no rejection" in page  # honest labs: nothing rejected
    assert "http://" not in page and "https://" not in page

    for lab in LABS:
        rows = [json.loads(line) for line in (state / lab / "metrics.jsonl").read_text().splitlines()]
        assert {r["round"] for r in rows if not r.get("final")} == {0, 1, 2} and rows[-1].get("final") is True
        acc = EventAccumulator(str(tb / lab))
        acc.Reload()
        keys = set().union(*(scalar_items(r) for r in rows))
        assert set(acc.Tags()["scalars"]) == keys and "train/loss" in keys
        final = rows[-1]
        assert acc.Scalars("eval_accuracy")[-1].step == final["round"]
        assert acc.Scalars("eval_accuracy")[-1].value == pytest.approx(final["eval_accuracy"])
