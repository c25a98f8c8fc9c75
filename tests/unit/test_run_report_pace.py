"""`hacfed report` of a paced `hacfed sim` run: each lab's rounds, the staleness of what it trained on,
and its simulated compute and idle time, from the rows' `sim/*` keys; a lab's absurd values are left
out and its name is escaped; a run without `sim/*` keys gets no such section."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from hacfed.server.reporting import append_rows
from hacfed.tools.cli import main
from hacfed.tools.run_report import load_run
from hacfed.tools.run_report_charts import overview_charts
from hacfed.tools.run_report_pace import lab_paces, sim_value

# (round, start, finish, idle, compute, trained, {staleness: samples}); round 3 is the final update.
# lab-a is 4x faster than lab-b and runs one round ahead (K = 1), so half its round-2 samples are 1 round old.
STEPS = {
    "lab-a": [(0, 0, 1, 0, 1, 0, {}), (1, 1, 2, 0, 1, 8, {0: 8}), (2, 4, 5, 2, 1, 16, {0: 8, 1: 8}),
              (3, 8, 9, 3, 1, 8, {0: 8})],
    "lab-b": [(0, 0, 4, 0, 4, 0, {}), (1, 4, 8, 0, 4, 8, {0: 8}), (2, 8, 12, 0, 4, 16, {0: 16}),
              (3, 12, 16, 0, 4, 8, {0: 8})],
}


def _sim_keys(start, finish, idle, compute, trained, by) -> dict:
    keys = {"sim/start_s": start, "sim/finish_s": finish, "sim/idle_s": idle, "sim/compute_s": compute,
            "sim/trained_samples": float(trained)}
    if by:
        keys["sim/staleness_mean"] = sum(s * n for s, n in by.items()) / sum(by.values())
        keys["sim/staleness_max"] = float(max(by))
        keys.update({f"sim/staleness_{s}": float(n) for s, n in by.items()})
    return keys


def _rows(paced: bool = True, agents: dict | None = None) -> list[dict]:
    rows = []
    for agent, steps in (agents or STEPS).items():
        for rnd, *step in steps:
            row = {"round": rnd, "agent": agent, "mode": "xhacpo", "seed": 0}
            if rnd == 3:
                row.update(final=True, eval_accuracy=0.5)
            else:
                row.update(reward_mean=0.5, accepted=8, rejected=0, capability=0.5)
            if paced:
                row.update(_sim_keys(*step))
            rows.append(row)
    return rows


def _report(tmp_path: Path, rows: list[dict]) -> str:
    append_rows(tmp_path / "run" / "metrics.jsonl", rows)
    out = tmp_path / "report.html"
    assert main(["report", str(tmp_path / "run"), "--out", str(out)]) == 0
    return out.read_text(encoding="utf-8")


def test_each_labs_pace_is_summed_over_its_steps() -> None:
    paces = lab_paces(_rows())
    a, b = paces["lab-a"], paces["lab-b"]
    assert (a.rounds, a.steps, a.last_round, a.trained) == (3, 4, 2, 32.0)
    assert a.staleness_mean == pytest.approx(8 / 32) and a.staleness_max == 1.0 and a.by_staleness == {0: 24, 1: 8}
    assert (a.compute_s, a.idle_s, a.finish_s) == (4.0, 5.0, 9.0) and a.idle_share == pytest.approx(5 / 9)
    assert (b.staleness_mean, b.idle_share, b.finish_s, b.by_staleness) == (0.0, 0.0, 16.0, {0: 32})
    assert lab_paces(_rows(paced=False)) == {}


def test_the_report_of_a_paced_run_has_a_pace_table_and_two_clock_charts(tmp_path: Path) -> None:
    page = _report(tmp_path, _rows())
    assert "<h3>Pace and staleness (simulated clock)</h3>" in page
    assert ("<tr><td>lab-a</td><td>3</td><td>2</td><td>32</td><td>0.25</td><td>1</td><td>0: 24, 1: 8</td>"
            "<td>4.0</td><td>5.0</td><td>56 %</td><td>9.0</td></tr>") in page
    assert ("<tr><td>lab-b</td><td>3</td><td>2</td><td>32</td><td>0.00</td><td>0</td><td>0: 32</td>"
            "<td>16.0</td><td>0.0</td><td>0 %</td><td>16.0</td></tr>") in page
    titles = [c.title for c in overview_charts(load_run(tmp_path / "run"))]
    assert "Simulated clock" in titles and "Staleness" in titles
    assert "left out" not in page


def test_a_synchronous_run_has_no_pace_section(tmp_path: Path) -> None:
    page = _report(tmp_path, _rows(paced=False))
    assert "Pace and staleness" not in page and "sim/" not in page
    titles = [c.title for c in overview_charts(load_run(tmp_path / "run"))]
    assert "Simulated clock" not in titles and "Staleness" not in titles


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0, 1.7e308, True, "3"])
def test_absurd_values_are_left_out_and_counted(bad: object) -> None:
    assert sim_value(bad) is None
    rows = _rows()
    rows[2]["sim/idle_s"] = bad  # lab-a's round 2: idle 2 s
    rows[2]["sim/staleness_99999"] = 5.0  # an S beyond any bound: not a staleness column
    a = lab_paces(rows)["lab-a"]
    assert a.idle_s == 3.0 and a.left_out == 1 and a.by_staleness == {0: 24, 1: 8}
    assert math.isfinite(a.idle_share)


def test_hostile_names_are_escaped_and_the_note_says_what_was_left_out(tmp_path: Path) -> None:
    name = "<img src=x onerror=alert(1)>$\\frac{$"
    rows = _rows(agents={name: STEPS["lab-a"], "lab-b": STEPS["lab-b"]})
    rows[1]["sim/compute_s"] = 1e300
    rows[2]["sim/finish_s"] = float("inf")  # append_rows drops it: not JSON
    page = _report(tmp_path, rows)
    assert name not in page and "<img src=x" not in page
    assert re.search(r"<td>&lt;img src=x onerror=alert\(1\)&gt;\$\\frac\{\$</td><td>3</td>", page)
    assert "1 <code>sim/*</code> values that were not finite numbers" in page
    table = page[page.index("Pace and staleness"):page.index("Rejections by error code")]
    assert "inf" not in table.lower() and "nan" not in table.lower() and "e+300" not in table.lower()
