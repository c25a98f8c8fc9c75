"""The dashboard's staleness column: from a journal the real federation driver wrote at max_staleness
K = 1 (tests/unit/test_stale_driver.py's hand-played streaming loop), at K = 0, and from a journal
older than schema 4 (no `sent_sources` table)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from hacfed.server.dashboard.pace import NO_STALENESS, lab_staleness
from hacfed.server.dashboard.reader import DashboardSources, Snapshotter
from tests.unit.test_coordinator_fakes import FakeClock
from tests.unit.test_server_driver import Federation
from tests.unit.test_stale_driver import K, Poller, _two_labs

STALE_KEYS = tuple(NO_STALENESS)


def dashboard_sources(fed: Federation, tmp_path: Path, rounds: int = 4) -> DashboardSources:
    return DashboardSources(journal=Path(fed.driver.config.coordinator.journal_path),
                            metrics=tmp_path / "no-metrics.jsonl", keys_dir=fed.keys_dir,
                            status=tmp_path / "no-status.json", run_id="stale", rounds=rounds,
                            round_deadline_s=100.0, expected_participants=2, ttl_s=0.0)


def shown(sources: DashboardSources, clock: FakeClock) -> dict[str, dict]:
    state = Snapshotter(sources, clock=clock).get()
    assert state["error"] is None, state["error"]
    return {p["id"]: {k: p[k] for k in ("last_round", *STALE_KEYS)} for p in json.loads(json.dumps(state))[
        "participants"]}


def expected(fed: Federation) -> dict[str, dict]:
    """What the column should say, from the coordinator's own reading of its journal (`sent_steps`)."""
    latest = {}
    for step in fed.driver.journal.sent_steps():
        if step.sources:
            latest[step.participant_id] = step  # by participant and step: the last one wins
    out = {}
    for pid, step in latest.items():
        ages = [step.step - 1 - q for q, sources in step.sources.items() for _ in sources]
        out[pid] = {"stale_step": step.step, "stale_max": max(ages), "stale_mean": sum(ages) / len(ages),
                    "stale_sources": len(ages)}
    return out


def run_k1_ahead(tmp_path: Path) -> tuple[Federation, Poller]:
    """lab-a runs one step ahead while lab-b holds round 0 open, then both answer until lab-a's step 2
    carries lab-b's round 0 (one round stale) and its own round 1."""
    fed, loop = _two_labs(tmp_path)
    for _ in range(4):
        loop.poll("lab-a")
    loop.poll("lab-a", "lab-b")  # lab-b's step 0 closes round 0
    loop.poll("lab-a", "lab-b")
    return fed, loop


def test_each_labs_staleness_at_k1_is_that_of_its_latest_update(tmp_path: Path) -> None:
    fed, loop = _two_labs(tmp_path)
    sources = dashboard_sources(fed, tmp_path)
    loop.poll("lab-a")
    loop.poll("lab-a")  # lab-a's step 1: its own round 0 only; lab-b has only step 0 (nothing to carry)
    parts = shown(sources, fed.clock)
    assert {k: parts["lab-a"][k] for k in STALE_KEYS} == {"stale_step": 1, "stale_max": 0, "stale_mean": 0.0,
                                                          "stale_sources": 1}
    assert {k: parts["lab-b"][k] for k in STALE_KEYS} == NO_STALENESS
    for _ in range(3):
        loop.poll("lab-a")
    loop.poll("lab-a", "lab-b")
    loop.poll("lab-a", "lab-b")
    parts = shown(sources, fed.clock)
    # lab-a's step 2: lab-b's round 0 (1 round old) and its own round 1 (0 rounds old)
    assert {k: parts["lab-a"][k] for k in STALE_KEYS} == {"stale_step": 2, "stale_max": 1, "stale_mean": 0.5,
                                                          "stale_sources": 2}
    assert {pid: {k: p[k] for k in STALE_KEYS} for pid, p in parts.items()} == expected(fed)
    for _ in range(30):
        if fed.driver.finished():
            break
        loop.poll("lab-a", "lab-b")
    assert fed.driver.finished(), "\n".join(fed.lines)
    parts = shown(sources, fed.clock)
    assert {pid: {k: p[k] for k in STALE_KEYS} for pid, p in parts.items()} == expected(fed)
    assert all(p["stale_step"] == 4 and 0 <= p["stale_max"] <= K for p in parts.values())  # the final update


def test_a_synchronous_run_shows_no_staleness(tmp_path: Path) -> None:
    fed = Federation(tmp_path, FakeClock())
    fed.add(1, "lab-a")
    fed.add(2, "lab-b")
    fed.run()
    parts = shown(dashboard_sources(fed, tmp_path, rounds=2), fed.clock)
    assert set(parts) == {"lab-a", "lab-b"} and all(p["last_round"] == 1 for p in parts.values())
    assert all({k: p[k] for k in STALE_KEYS} == NO_STALENESS for p in parts.values())


def test_a_journal_older_than_schema_4_reads_without_staleness(tmp_path: Path) -> None:
    fed, _ = run_k1_ahead(tmp_path)
    fed.driver.journal.close()
    old = tmp_path / "old.sqlite"
    with sqlite3.connect(fed.driver.config.coordinator.journal_path) as db:
        db.execute(f"VACUUM INTO '{old}'")
    with sqlite3.connect(old) as db:
        db.executescript("DROP TABLE sent_sources; DROP TABLE sent_steps; PRAGMA user_version=3;")
    sources = dashboard_sources(fed, tmp_path)
    parts = shown(DashboardSources(**{**sources.__dict__, "journal": old}), fed.clock)
    assert parts["lab-a"]["last_round"] >= 1 and parts["lab-b"]["last_round"] >= 0  # the rest of the row reads
    assert all({k: p[k] for k in STALE_KEYS} == NO_STALENESS for p in parts.values())


def test_lab_staleness_takes_each_labs_latest_step_only() -> None:
    rows = [{"participant_id": "a", "step": 1, "round_id": 0}, {"participant_id": "a", "step": 3, "round_id": 0},
            {"participant_id": "a", "step": 3, "round_id": 2}, {"participant_id": "a", "step": 3, "round_id": 2},
            {"participant_id": "b", "step": 2, "round_id": 1}]
    got = lab_staleness(rows)
    assert got["a"] == {"stale_step": 3, "stale_max": 2, "stale_mean": pytest.approx(2 / 3), "stale_sources": 3}
    assert got["b"] == {"stale_step": 2, "stale_max": 0, "stale_mean": 0.0, "stale_sources": 1}
    assert lab_staleness([]) == {}
