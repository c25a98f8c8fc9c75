"""Journal schema 3: each distinct prompt is stored once (`prompts`) and every trajectory names it;
the pool reads back the same prompts; a rolled-back submission leaves no prompt id behind that a
later submission could reuse."""

from __future__ import annotations

from pathlib import Path

import pytest

from hacfed.server.coordinator.errors import AuditError
from tests.unit.test_coordinator_fakes import make_coordinator, scripted_submission


def test_every_labs_samples_of_a_prompt_share_one_stored_prompt(tmp_path: Path) -> None:
    coord = make_coordinator(tmp_path, rounds=2, expected_participants=3, prompts_per_round=4)
    for pid in ("a", "b", "c"):
        coord.register(pid)
    plan = coord.open_round(0)
    for pid in ("a", "b", "c"):
        coord.submit(scripted_submission(plan, pid))
    db = coord.journal._db
    assert db.execute("SELECT COUNT(*) FROM prompts").fetchone()[0] == 4
    assert db.execute("SELECT COUNT(DISTINCT prompt_ref) FROM trajectories").fetchone()[0] == 4
    pool = coord.journal.pool(0)
    assert len(pool) == 3 * 4 * 3
    assert {t.prompt_id: t.prompt for t in pool} == {p.prompt_id: p.messages for p in plan.prompts}
    coord.close_round("quorum")
    plan1 = coord.open_round(1)
    coord.submit(scripted_submission(plan1, "a"))
    new = {p.messages for p in plan1.prompts} - {p.messages for p in plan.prompts}
    assert db.execute("SELECT COUNT(*) FROM prompts").fetchone()[0] == 4 + len(new)


def test_a_rolled_back_submission_leaves_no_prompt_id_to_reuse(tmp_path: Path, monkeypatch) -> None:
    coord = make_coordinator(tmp_path, rounds=2, expected_participants=2)
    for pid in ("a", "b"):
        coord.register(pid)
    plan = coord.open_round(0)
    journal = coord.journal
    real_audit = journal._audit

    def failing(event):
        raise AuditError("disk full")

    monkeypatch.setattr(journal, "_audit", failing)
    refused = coord.submit(scripted_submission(plan, "a"))
    assert refused.receipt is None and journal._db.execute("SELECT COUNT(*) FROM prompts").fetchone()[0] == 0
    assert journal._prompt_ids == {}
    monkeypatch.setattr(journal, "_audit", real_audit)
    coord.failed_closed = None  # the operator fixed the disk and restarted
    accepted = coord.submit(scripted_submission(plan, "b"))
    assert accepted.receipt is not None and len(journal.pool(0)) == len(accepted.accepted_ids)
    assert {t.prompt for t in journal.pool(0)} == {p.messages for p in plan.prompts}
    assert journal.pragma("integrity_check") == "ok"
    assert journal._db.execute("PRAGMA foreign_key_check").fetchall() == []


def test_a_prompt_row_is_required(tmp_path: Path) -> None:
    import sqlite3

    coord = make_coordinator(tmp_path, expected_participants=1)
    coord.register("a")
    coord.submit(scripted_submission(coord.open_round(0), "a"))
    db = coord.journal._db
    seq = db.execute("SELECT seq FROM submissions").fetchone()[0]
    row = "INSERT INTO trajectories VALUES ('t', ?, 'a', 0, 'p', 0, 0, ?, 'x', 0.0, 0.0, -1.0, 1, 'stop', 0, 0)"
    with pytest.raises(sqlite3.IntegrityError, match="FOREIGN KEY"):
        db.execute(row, (seq, 999))  # no such prompt
    db.execute(row, (seq, 1))  # the same row naming a stored prompt is fine
