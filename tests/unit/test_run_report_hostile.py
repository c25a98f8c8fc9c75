"""`hacfed report` on metrics a lab chose: names that look like matplotlib mathtext and extreme or
non-finite values still give a report, and the charts say what was left out."""
from __future__ import annotations

from pathlib import Path

import pytest

from hacfed.server.reporting import append_rows
from hacfed.tools.cli import main
from hacfed.tools.run_report import load_run, plottable
from hacfed.tools.run_report_charts import lab_charts, overview_charts

MATH = "lab-$\\frac{$"  # unbalanced mathtext: "Expected end of text" when parsed


def _rows(source: str, low: float, high: float) -> list[dict]:
    rows = []
    for r in range(3):
        for agent, peer in ((MATH, "lab-b"), ("lab-b", source)):
            rows.append({"round": r, "agent": agent, "mode": "xhacpo", "seed": 0, "reward_mean": high,
                         "accepted": 4, "rejected": 0, "capability": low if agent == MATH else 0.5,
                         "eval_accuracy": 0.5, f"train/cross/{peer}/ratio_p10": low,
                         f"train/cross/{peer}/ratio_p50": 1.0, f"train/cross/{peer}/ratio_p90": high})
    return rows


@pytest.mark.parametrize("fmt", ["html", "png"])
def test_mathtext_names_and_extreme_values_still_give_a_report(tmp_path: Path, fmt: str,
                                                              capsys: pytest.CaptureFixture) -> None:
    state = tmp_path / "coordinator"
    append_rows(state / "metrics.jsonl", _rows("$\\frac{$x", 5e-324, 1.7e308))
    out = tmp_path / f"report.{fmt}"
    assert main(["report", str(state), "--out", str(out)]) == 0, capsys.readouterr()
    assert out.stat().st_size > 10_000


def test_plottable_clips_extremes_and_counts_them() -> None:
    points, left_out = plottable([(0, 1e-300), (1, 2.0), (2, 1e300), (3, float("nan"))], log=True)
    assert points == [(1, 2.0)] and left_out == 3
    points, left_out = plottable([(0, -1e300), (1, 2.0)], log=False)
    assert points == [(1, 2.0)] and left_out == 1


def test_every_chart_draws_names_verbatim_and_notes_what_it_left_out(tmp_path: Path) -> None:
    append_rows(tmp_path / "metrics.jsonl", _rows("$x$", 1e-300, 1e300))
    data = load_run(tmp_path / "metrics.jsonl")
    plt = pytest.importorskip("hacfed.tools.run_report_html")._pyplot()
    notes, labels = {}, set()
    for chart in overview_charts(data) + lab_charts(data, MATH) + lab_charts(data, "lab-b"):
        fig, ax = plt.subplots()
        try:
            chart.draw(ax)
            fig.canvas.draw()
            notes[chart.title] = ax.get_xlabel()
            labels |= {t.get_text() for t in ax.get_legend().get_texts()} if ax.get_legend() else set()
        finally:
            plt.close(fig)
    assert "left out" in notes["Reward"] and "left out" in notes["Cross-ratio histogram"]
    assert "left out" not in notes["Held-out accuracy"]
    assert "lab-\\$\\frac{\\$" in labels  # escaped: matplotlib draws it as typed
