"""`hacfed report`: synthetic runs written in the real formats (the coordinator's JSONL writer and
journal schema) become a self-contained HTML page or a PNG; a folder without metrics is exit 2."""

from __future__ import annotations

import base64
import re
import sqlite3
from pathlib import Path

import pytest

from hacfed.server.coordinator.journal import Journal
from hacfed.server.reporting import append_rows
from hacfed.tools.cli import main
from hacfed.tools.run_report import (
    NoMetrics,
    capability_ratios,
    find_sources,
    load_run,
    ratio_quantile_samples,
    read_rows,
    totals,
)

AGENTS = ("lab-a", "lab-b")
CAPS = {"lab-a": [0.2, 0.4, 0.5], "lab-b": [0.4, 0.4, 0.01]}


def _rows(cross: bool = True) -> list[dict]:
    rows = []
    for r in range(3):
        for agent in AGENTS:
            peer = "lab-b" if agent == "lab-a" else "lab-a"
            row = {"round": r, "agent": agent, "mode": "xhacpo", "seed": 0, "reward_mean": 0.1 * (r + 1),
                   "accepted": 16 - (agent == "lab-b") * 4, "rejected": (agent == "lab-b") * 4,
                   "capability": CAPS[agent][r], "submitted": True, "quarantined": False,
                   "train/loss": 0.5, "train/time_rollout_s": 0.1}
            if r % 2 == 0:
                row["eval_accuracy"] = 0.3 + 0.05 * r
            if cross and r > 0:
                row.update({f"train/cross/{peer}/ratio_p10": 0.5, f"train/cross/{peer}/ratio_p50": 0.9,
                            f"train/cross/{peer}/ratio_p90": 1.0, f"train/cross/{peer}/grad_frac": 0.75})
            rows.append(row)
    rows += [{"round": 3, "agent": a, "mode": "xhacpo", "seed": 0, "final": True, "eval_accuracy": 0.45}
             for a in AGENTS]
    return rows


def _state_dir(tmp_path: Path, cross: bool = True, journal: bool = True) -> Path:
    state = tmp_path / "coordinator"
    append_rows(state / "metrics.jsonl", _rows(cross))  # the coordinator's own writer (server/reporting.py)
    if journal:
        Journal(state / "journal.sqlite").close()  # the real schema
        with sqlite3.connect(state / "journal.sqlite") as db:
            db.executemany("INSERT INTO rejections (participant_id, round_id, submission_seq, trajectory_id, code, "
                           "detail, at) VALUES (?, ?, ?, ?, ?, ?, 0)",
                           [("lab-b", 0, 1, f"t{i}", "HACFED-E-REWARD-MISMATCH", "claimed 1.0") for i in range(3)]
                           + [("lab-b", 1, 2, "t9", "HACFED-E-GROUP-REJECTED", "sibling")]
                           + [("lab-b", 2, None, None, "HACFED-E-ROUND-CLOSED", "late")])
    return state


def _images(page: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'<img [^>]*src="data:image/png;base64,([^"]+)"', page)]


def test_html_report_is_self_contained_with_lab_sections_charts_and_codes(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture) -> None:
    state = _state_dir(tmp_path)
    out = tmp_path / "report.html"
    assert main(["report", str(state), "--out", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    # run-wide: accuracy, reward, P̂, ω, cross-ratio histogram, accepted/rejected, codes; per lab: curves,
    # ratios over time, histogram
    images = _images(page)
    assert len(images) == 7 + 2 * 3 == page.count("<img ")
    assert f"({len(images)} charts)" in capsys.readouterr().out
    assert all(png[:8] == b"\x89PNG\r\n\x1a\n" for png in images)
    for agent in AGENTS:
        assert f"<section class='lab' id='lab-{agent}'><h2>Lab {agent}</h2>" in page
    assert "<td>lab-b</td><td>rejected trajectories</td><td>HACFED-E-REWARD-MISMATCH</td><td>3</td>" in page
    assert "<td>lab-b</td><td>rejected trajectories</td><td>HACFED-E-GROUP-REJECTED</td><td>1</td>" in page
    assert "<td>lab-b</td><td>refused submissions</td><td>HACFED-E-ROUND-CLOSED</td><td>1</td>" in page
    # summary: first/last accuracy (the final evaluation included) and the metrics' totals
    assert "<td>lab-b</td><td>0.300</td><td>0.450</td><td>36</td><td>12</td><td>4</td><td>1</td>" in page
    assert "http://" not in page and "https://" not in page and "<script" not in page and "<link" not in page


def test_a_run_without_cross_samples_or_journal_gets_fewer_charts_and_says_why(tmp_path: Path) -> None:
    state = _state_dir(tmp_path, cross=False, journal=False)
    out = tmp_path / "r.html"
    assert main(["report", str(state / "metrics.jsonl"), "--out", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert len(_images(page)) == 5 + 2 * 1  # no histogram, no codes chart; one curve chart per lab
    assert "error codes are unknown" in page


def test_png_report_is_one_image(tmp_path: Path) -> None:
    out = tmp_path / "r.png"
    assert main(["report", str(_state_dir(tmp_path)), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000


@pytest.mark.parametrize("name", ["report.html", "report.png"])
def test_a_link_planted_at_the_temp_name_is_not_written_through(tmp_path: Path, name: str) -> None:
    state = _state_dir(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (state / f"{name}.tmp").symlink_to(victim)
    assert main(["report", str(state), "--out", str(state / name)]) == 0
    assert victim.read_text() == "keep me"
    assert (state / name).is_file() and not (state / name).is_symlink()


@pytest.mark.parametrize("setup", ["empty", "missing", "empty-file", "bad-suffix"])
def test_no_metrics_is_one_line_and_exit_2(setup: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    target, out = tmp_path / "run", []
    if setup == "empty":
        target.mkdir()
    elif setup == "empty-file":
        target.mkdir()
        (target / "metrics.jsonl").write_text("\n{not json\n")
    elif setup == "bad-suffix":
        target = _state_dir(tmp_path)
        out = ["--out", str(tmp_path / "r.pdf")]
    assert main(["report", str(target), *out]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hacfed report: error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "run" / "report.html").exists()


def test_capability_ratio_is_eq10_of_the_logged_capabilities() -> None:
    ratios = capability_ratios(_rows(), list(AGENTS))
    assert [v for _, v in ratios[("lab-a", "lab-b")]] == pytest.approx([2.0, 1.0, 0.1])  # 0.01/0.5 clipped
    assert [v for _, v in ratios[("lab-b", "lab-a")]] == pytest.approx([0.5, 1.0, 10.0])


def test_rows_quantiles_and_totals() -> None:
    rows = _rows()
    assert ratio_quantile_samples(rows, "lab-a") == {"lab-b": {"ratio_p10": [0.5, 0.5], "ratio_p50": [0.9, 0.9],
                                                               "ratio_p90": [1.0, 1.0]}}
    assert totals(rows) == {"lab-a": (48, 0), "lab-b": (36, 12)}


def test_read_rows_skips_a_torn_line_and_keeps_the_last_copy_of_a_round(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    append_rows(path, [{"round": 0, "agent": "a", "reward_mean": 0.1}, {"round": 0, "agent": "a", "reward_mean": 0.2}])
    with path.open("a") as fh:
        fh.write('{"round": 1, "agent": "a", "rew')
    assert read_rows([path]) == [{"round": 0, "agent": "a", "reward_mean": 0.2}]


def test_sources_of_a_sim_dir_a_demo_root_and_an_ambiguous_dir(tmp_path: Path) -> None:
    sim = tmp_path / "sim"
    append_rows(sim / "sim.jsonl", _rows())
    Journal(sim / "state" / "journal.sqlite").close()
    assert find_sources(sim).metrics == (sim / "sim.jsonl",)
    assert find_sources(sim).journal == sim / "state" / "journal.sqlite"
    labs = tmp_path / "demo"  # labs' own STATE/metrics.jsonl and the coordinator's journal
    for agent in AGENTS:
        append_rows(labs / agent / "metrics.jsonl", [r for r in _rows() if r["agent"] == agent])
    Journal(labs / "coordinator" / "journal.sqlite").close()
    data = load_run(labs)
    assert data.agents == list(AGENTS) and len(data.rows) == len(_rows())
    assert data.sources.journal == labs / "coordinator" / "journal.sqlite"
    append_rows(sim / "other.jsonl", _rows())
    with pytest.raises(NoMetrics, match="several metrics files"):
        find_sources(sim)


def test_a_lab_reporting_its_partners_use_drift_and_trust_gets_a_chart_of_them(tmp_path: Path) -> None:
    """Issue 39, "What a lab sees every update": the share of partners' samples used, the trust weight in each
    partner, the KL to the start model, the truncated fraction and the answer-form share, per lab."""
    from hacfed.tools.run_report import load_run
    from hacfed.tools.run_report_charts import has_learner_view, lab_charts

    rows = _rows(cross=False)
    for r in rows:
        if r["agent"] == AGENTS[0] and not r.get("final"):
            r.update({"train/kl": 0.1 * r["round"], "train/answer_form_start_share": 1.0 - 0.1 * r["round"],
                      "train/partner/grad_frac": 0.2, "train/trust/$\\frac{$": 0.5,
                      "train/rollout_truncated_frac": 0.05})
    state = tmp_path / "state"
    append_rows(state / "metrics.jsonl", rows)
    data = load_run(state)
    assert has_learner_view(data, AGENTS[0]) and not has_learner_view(data, AGENTS[1])
    titles = [c.title for c in lab_charts(data, AGENTS[0])]
    assert titles == [f"{AGENTS[0]}: curves", f"{AGENTS[0]}: partners' samples and drift"]
    out = tmp_path / "r.html"
    assert main(["report", str(state / "metrics.jsonl"), "--out", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert len(_images(page)) == 5 + 2 * 1 + 1  # the other tests' count, plus this lab's new chart
    assert f"{AGENTS[0]}: partners&#x27; samples and drift" in page or f"{AGENTS[0]}: partners' samples" in page
