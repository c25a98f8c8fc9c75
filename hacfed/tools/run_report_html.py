"""`hacfed report RUN_DIR [--out FILE.html|FILE.png]`: one run's metrics as a self-contained report.

    hacfed report state/coordinator                     # -> state/coordinator/report.html
    hacfed report runs/demo-metrics.jsonl --out runs/demo-report.png

The HTML file carries everything inline (charts are PNG data URIs, the style is in the page, no
script), so it can be mailed to another lab or opened offline; it fetches nothing. The PNG is one
image of the run-wide charts. RUN_DIR is any folder hacfed.tools.run_report understands (a coordinator's
or a lab's state dir, a `hacfed sim`/`hacfed demo` metrics file or its folder); a folder without
metrics is refused with exit code 2.
"""

from __future__ import annotations

import base64
import html
import io
import math
import re
import sys
from pathlib import Path
from typing import Any, Sequence

from hacfed.envelope import write_atomic
from hacfed.tools.run_report import NoMetrics, RunData, accuracy_change, load_run, totals
from hacfed.tools.run_report_charts import Chart, lab_charts, overview_charts, text
from hacfed.tools.run_report_pace import MAX_VALUE, LabPace, lab_paces

STYLE = """body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}
h1{font-size:1.5em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:.2em .6em;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}
figure{display:inline-block;margin:.5em;vertical-align:top;max-width:520px}
figcaption{font-size:.85em;color:#555}img{max-width:100%}.note{color:#666;font-size:.9em}"""


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    return plt


def chart_png(chart: Chart, size: tuple[float, float] = (5.2, 3.4)) -> bytes:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=size)
    try:
        chart.draw(ax)
        legends = [ax.get_legend()] if ax.get_legend() is not None else []
        for legend in legends:  # outside the axes: the image widens to hold it, the axes keep their size
            legend.set_in_layout(False)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=90, bbox_inches="tight", bbox_extra_artists=legends)
        return buf.getvalue()
    finally:
        plt.close(fig)


def _figure(chart: Chart) -> str:
    data = base64.b64encode(chart_png(chart)).decode("ascii")
    return (f'<figure><img alt="{html.escape(chart.title)}" src="data:image/png;base64,{data}">'
            f"<figcaption><b>{html.escape(chart.title)}</b>: {_code(html.escape(chart.caption))}</figcaption></figure>")


def _code(text: str) -> str:
    """`key` in a caption as <code>key</code> (captions name the metrics keys they plot)."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", text)


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def summary_table(data: RunData) -> str:
    counts = totals(data.rows)
    rows = []
    for agent in data.agents:
        change = accuracy_change(data.rows, agent)
        first, last = (f"{change[0]:.3f}", f"{change[1]:.3f}") if change else ("–", "–")
        accepted, rejected = counts.get(agent, (0, 0))
        rows.append((agent, first, last, accepted, rejected, sum(data.rejections.get(agent, {}).values()),
                     sum(data.refusals.get(agent, {}).values())))
    return _table(("lab", "accuracy first", "accuracy last", "accepted", "rejected", "rejected (journal)",
                   "refused submissions"), rows)


def codes_section(data: RunData) -> str:
    if data.sources.journal is None:
        return ('<p class="note">No coordinator journal (journal.sqlite) beside these metrics, so rejections are '
                "counted (table above) but their error codes are unknown.</p>")
    rows = [(agent, kind, code, n) for kind, table in (("rejected trajectories", data.rejections),
                                                       ("refused submissions", data.refusals))
            for agent in sorted(table) for code, n in sorted(table[agent].items())]
    if not rows:
        return "<p>The journal records no rejection and no refusal.</p>"
    return _table(("lab", "what", "code", "count"), rows)


def _seconds(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def _by_staleness(pace: LabPace) -> str:
    return ", ".join(f"{s}: {n:.0f}" for s, n in pace.by_staleness.items()) or "–"


def pace_section(data: RunData) -> str:
    """Each lab's steps on the simulated clock and the staleness of what it trained on; "" for a run
    whose rows carry no `sim/*` keys (hacfed.tools.run_report_pace)."""
    paces = lab_paces(data.rows)
    if not paces:
        return ""
    rows = []
    for agent, p in paces.items():
        share = "–" if p.idle_share is None else f"{100 * p.idle_share:.0f} %"
        mean = "–" if p.staleness_mean is None else f"{p.staleness_mean:.2f}"
        rows.append((agent, p.rounds, "–" if p.last_round is None else p.last_round, f"{p.trained:.0f}", mean,
                     "–" if p.staleness_max is None else f"{p.staleness_max:.0f}", _by_staleness(p),
                     _seconds(p.compute_s), _seconds(p.idle_s), share, _seconds(p.finish_s)))
    left_out = sum(p.left_out for p in paces.values())
    note = (f"<p class='note'>{left_out} <code>sim/*</code> values that were not finite numbers in "
            f"[0, {MAX_VALUE:.0e}] were left out.</p>" if left_out else "")
    return ("<h3>Pace and staleness (simulated clock)</h3><p class='note'>From the rows' <code>sim/*</code> keys "
            "(a paced <code>hacfed sim</code> run): rounds each lab rolled out, the samples its updates trained on "
            "(the final update included) and how many rounds old they were, and its simulated seconds computing "
            "and waiting for slower labs; idle share = idle / (idle + compute).</p>"
            + _table(("lab", "rounds", "last round", "samples trained on", "staleness mean", "staleness max",
                      "samples by staleness", "compute (s)", "idle (s)", "idle share", "finished at (s)"), rows)
            + note)


def render_html(data: RunData, title: str) -> tuple[str, int]:
    """The page and the number of charts in it."""
    overview, n = overview_charts(data), 0
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>",
             f"<p class='note'>Metrics: {html.escape(', '.join(str(p) for p in data.sources.metrics))}; journal: "
             f"{html.escape(str(data.sources.journal) if data.sources.journal else 'none')}; modes: "
             f"{html.escape(', '.join(data.modes) or 'unknown')}; {len(data.agents)} labs, "
             f"{1 + max(int(r['round']) for r in data.rows if not r.get('final'))} rounds.</p>"
             if any(not r.get("final") for r in data.rows) else "",
             "<h2>Summary</h2>", summary_table(data), pace_section(data),
             "<h3>Rejections by error code</h3>", codes_section(data),
             "<h2>The federation</h2>"]
    parts += [_figure(c) for c in overview]
    n += len(overview)
    for agent in data.agents:
        charts = lab_charts(data, agent)
        parts.append(f"<section class='lab' id='lab-{html.escape(agent)}'><h2>Lab {html.escape(agent)}</h2>")
        parts += [_figure(c) for c in charts]
        parts.append("</section>")
        n += len(charts)
    parts.append("</body></html>")
    return "\n".join(parts), n


def render_png(data: RunData, path: Path, title: str) -> int:
    """The run-wide charts on one grid; returns how many."""
    charts = overview_charts(data)
    plt = _pyplot()
    cols = 2 if len(charts) > 1 else 1
    rows = max(1, math.ceil(len(charts) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(6.0 * cols, 3.6 * rows), squeeze=False)
    try:
        for ax, chart in zip(axes.flat, charts):
            chart.draw(ax)
        for ax in list(axes.flat)[len(charts):]:
            ax.axis("off")
        fig.suptitle(text(title))  # the run directory's name, shown verbatim
        fig.tight_layout()
        _atomic_write(path, lambda fh: fig.savefig(fh, format="png", dpi=90))
    finally:
        plt.close(fig)
    return len(charts)


def _atomic_write(path: Path, write: Any) -> None:
    """`write(file)` into memory, then a fresh temp file beside `path` and a rename: a file or
    link someone planted at a predictable temp name is never followed or written through."""
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    write(buffer)
    write_atomic(path, buffer.getvalue(), 0o644)


def write_report(run: Path, out: Path | None) -> tuple[Path, int]:
    """Load the run and write the report; returns (file, charts). Raises NoMetrics / ValueError."""
    data = load_run(run)
    out = out or (Path(run) if Path(run).is_dir() else Path(run).parent) / "report.html"
    suffix = out.suffix.lower()
    if suffix not in (".html", ".htm", ".png"):
        raise ValueError(f"--out must end in .html or .png, got {str(out)!r}")
    title = f"hacfed report: {Path(run).resolve().name}"
    if suffix == ".png":
        return out, render_png(data, out, title)
    page, n = render_html(data, title)
    _atomic_write(out, lambda fh: fh.write(page.encode("utf-8")))
    return out, n


def add_parser(sub: Any) -> None:
    p = sub.add_parser("report", help="a self-contained HTML (or PNG) report of one run's metrics",
                       description=__doc__.split("\n\n")[0] + "\n\n" + __doc__.split("\n\n")[2],
                       formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    p.add_argument("run", metavar="RUN_DIR", help="a coordinator's or lab's state dir, a hacfed sim/demo metrics "
                   "file (*.jsonl) or the folder holding it")
    p.add_argument("--out", metavar="FILE", default=None,
                   help="FILE.html (self-contained) or FILE.png (default: RUN_DIR/report.html)")


def run_from_args(args: Any) -> int:
    try:
        out, n = write_report(Path(args.run), Path(args.out) if args.out else None)
    except NoMetrics as exc:
        print(f"hacfed report: error: {exc}", file=sys.stderr)
        return 2
    except (ValueError, OSError) as exc:
        print(f"hacfed report: error: {exc}", file=sys.stderr)
        return 2
    print(f"hacfed report: wrote {out} ({n} charts)")
    return 0
