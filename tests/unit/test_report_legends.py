"""`hacfed report`'s legends stay outside the plot area: the ratio histogram of three labs has 18
entries (agent x source x quantile), and a legend inside the axes covered the chart."""

from __future__ import annotations

import io

import pytest

from hacfed.tools.run_report import RunData, RunSources
from hacfed.tools.run_report_charts import draw_cross_hist, overview_charts

AGENTS = ("lab-a-llama", "lab-b-gpt2", "lab-c-qwen2")


def _three_labs() -> RunData:
    rows = []
    for r in range(6):
        for agent in AGENTS:
            row = {"agent": agent, "round": r, "mode": "hacpo", "reward_mean": 0.1 * r}
            for k, source in enumerate(s for s in AGENTS if s != agent):
                for q, v in (("ratio_p10", 0.5), ("ratio_p50", 1.0), ("ratio_p90", 2.0)):
                    row[f"train/cross/{source}/{q}"] = v * (1 + 0.1 * r + 0.05 * k)
            rows.append(row)
    return RunData(rows=tuple(rows), sources=RunSources((), None))


@pytest.fixture
def plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    yield plt
    plt.close("all")


def _overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_the_18_entry_histogram_legend_is_outside_the_axes(plt):
    fig, ax = plt.subplots(figsize=(5.2, 3.4))
    draw_cross_hist(_three_labs(), list(AGENTS))(ax)
    fig.canvas.draw()
    legend = ax.get_legend()
    assert legend is not None and len(legend.get_texts()) == 18
    renderer = fig.canvas.get_renderer()
    assert not _overlap(legend.get_window_extent(renderer), ax.get_window_extent(renderer))


def test_no_overview_legend_covers_its_own_or_a_neighbouring_chart_on_the_png_grid(plt):
    charts = overview_charts(_three_labs())
    fig, axes = plt.subplots((len(charts) + 1) // 2, 2, figsize=(12.0, 3.6 * ((len(charts) + 1) // 2)), squeeze=False)
    for ax, chart in zip(axes.flat, charts):
        chart.draw(ax)
    fig.tight_layout()  # as render_png does
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [ax.get_window_extent(renderer) for ax in axes.flat]
    legends = [ax.get_legend() for ax in axes.flat if ax.get_legend() is not None]
    assert legends
    for legend in legends:
        assert not any(_overlap(legend.get_window_extent(renderer), box) for box in boxes)


def test_the_html_chart_image_widens_to_hold_the_legend():
    from PIL import Image

    from hacfed.tools.run_report_charts import Chart
    from hacfed.tools.run_report_html import chart_png

    png = chart_png(Chart("ratios", "", draw_cross_hist(_three_labs(), list(AGENTS))))
    with Image.open(io.BytesIO(png)) as image:
        width, height = image.size
    assert width > 5.2 * 90 and height >= 3.4 * 90 * 0.9  # the axes keep their size; the legend is added
