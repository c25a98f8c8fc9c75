"""The SQLite journal: durability pragmas, schema version and migration, run binding, atomic
submissions, and clear errors for a corrupt journal or a read-only state directory."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from hacfed.server.coordinator import Journal, JournalError, ValidationLimits, make_plan, validate_submission
from hacfed.server.coordinator.journal import SentStep, SubmissionRecord
from hacfed.server.coordinator.journal_schema import SENT_TABLES_SQL
from hacfed.server.coordinator.plan import plan_to_json
from tests.unit.test_coordinator_fakes import TASK, make_config, scripted_submission


def test_wal_and_synchronous_full_and_schema_version(tmp_path):
    journal = Journal(tmp_path / "j.sqlite")
    assert journal.pragma("journal_mode") == "wal"
    assert journal.pragma("synchronous") == 2  # FULL
    assert journal.pragma("integrity_check") == "ok"
    journal.close()
    db = sqlite3.connect(tmp_path / "j.sqlite")
    assert db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == ("5",)
    db.execute("UPDATE meta SET value='999' WHERE key='schema_version'")
    db.commit()
    db.close()
    with pytest.raises(JournalError, match="schema version 999"):
        Journal(tmp_path / "j.sqlite")


def test_journal_is_bound_to_one_run_and_its_plan_settings(tmp_path):
    cfg = make_config(tmp_path)
    with Journal(cfg.journal_path) as journal:
        journal.bind_run(cfg.run_id, cfg.plan_fingerprint())
        fingerprint = cfg.with_overrides({"round_deadline_s": 5}).plan_fingerprint()
        journal.bind_run(cfg.run_id, fingerprint)  # operational: fine
        with pytest.raises(JournalError, match="belongs to run 'test-run'"):
            journal.bind_run("other", cfg.plan_fingerprint())
        with pytest.raises(JournalError, match=r"different \['group_size'\]"):
            journal.bind_run(cfg.run_id, cfg.with_overrides({"group_size": 4}).plan_fingerprint())


def _record(tmp_path):
    cfg = make_config(tmp_path)
    journal = Journal(cfg.journal_path)
    plan = make_plan(cfg, TASK, 0)
    journal.insert_round(0, 0.0, 100.0, plan_to_json(plan))
    journal.upsert_participant("a", 0.0)
    sub = scripted_submission(plan, "a")
    outcome = validate_submission(sub, plan, TASK, ValidationLimits(plan.group_size, 8, 100, -50.0))
    record = SubmissionRecord("a", 0, "h" * 64, "", 10, 1.0, outcome.accepted, outcome.rejections, (), False, None)
    return journal, record


def test_a_submission_is_one_transaction(tmp_path):
    journal, record = _record(tmp_path)

    def explode(seq):
        raise OSError("disk full while rendering the result")

    with pytest.raises(OSError):
        journal.record_submission(record, explode)
    assert journal.count("submissions") == 0 and journal.count("trajectories") == 0  # rolled back whole
    seq = journal.record_submission(record, lambda seq: f"result {seq}")
    assert journal.count("trajectories") == len(record.accepted) == 6
    assert journal.stored_result("h" * 64) == f"result {seq}"
    assert [t.reward for t in journal.pool(0)] == [1.0, 0.0, 0.0] * 2


def test_uniqueness_constraints_refuse_double_counting(tmp_path):
    journal, record = _record(tmp_path)
    journal.record_submission(record, str)
    with pytest.raises(sqlite3.IntegrityError):  # same (participant, round)
        journal.record_submission(record, str)
    again = SubmissionRecord("a", 0, "k" * 64, "", 10, 1.0, record.accepted, (), (), False, None)
    with pytest.raises(sqlite3.IntegrityError):
        journal.record_submission(again, str)
    assert journal.count("submissions") == 1 and journal.count("trajectories") == 6
    journal.close()


def test_close_round_is_guarded_and_atomic(tmp_path):
    journal, record = _record(tmp_path)
    journal.close_round(0, "deadline", 5.0, True, {"a": 0.5}, {"window": 5, "minimum": 1e-8, "history": {"a": [0.5]}})
    closed = journal.round(0)
    assert closed.state == "CLOSED" and closed.close_reason == "deadline" and closed.below_quorum is True
    assert closed.capabilities == {"a": 0.5} and closed.tracker_state["history"] == {"a": [0.5]}
    assert [e["kind"] for e in journal.events()] == ["closed_below_quorum"]
    with pytest.raises(JournalError, match="not open"):
        journal.close_round(0, "deadline", 6.0, False, {}, {})
    journal.mark_published(0)
    assert journal.round(0).state == "PUBLISHED"


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_previous_release_journal_opens_and_migrates(tmp_path):
    """R10: tests/fixtures/journal-v2.sqlite is a journal of schema 2 (trajectory ids per source, each
    trajectory with its prompt's JSON), a first-release journal as that release migrated it; opening
    it migrates it in place through schema 3 (each prompt stored once) to 4 (the empty tables of what
    each lab was sent under max_staleness) without losing a row."""
    path = tmp_path / "journal.sqlite"
    shutil.copy(FIXTURES / "journal-v2.sqlite", path)
    with sqlite3.connect(path) as db:
        tables = ("rounds", "submissions", "trajectories")
        before = {t: db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in tables}
        old_pool = db.execute("SELECT trajectory_id, participant_id, reward FROM trajectories ORDER BY 2, 1").fetchall()
        old_prompts = db.execute("SELECT trajectory_id, prompt_json FROM trajectories ORDER BY 1").fetchall()
    assert before == {"rounds": 2, "submissions": 4, "trajectories": 24}
    with Journal(path) as journal:
        assert journal.pragma("integrity_check") == "ok"
        pool = journal.pool(0) + journal.pool(1)
        assert sorted((t.trajectory_id, t.source_id, t.reward) for t in pool) == sorted(old_pool)
        stored = journal.stored_result(next(iter(_hashes(path))))
        assert stored is not None and '"receipt"' in stored
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == ("5",)
        assert db.execute("SELECT COUNT(*) FROM sent_steps").fetchone() == (0,)
        assert db.execute("SELECT COUNT(*) FROM sent_sources").fetchone() == (0,)
        keys = [r[5] for r in db.execute("PRAGMA table_info(trajectories)") if r[5]]
        assert len(keys) == 2  # (participant_id, trajectory_id)
        assert db.execute("SELECT trajectory_id, prompt_json FROM trajectory_rows ORDER BY 1").fetchall() == old_prompts
        distinct = len({text for _, text in old_prompts})
        assert db.execute("SELECT COUNT(*) FROM prompts").fetchone()[0] == distinct < len(old_prompts)
    with Journal(path) as journal:  # opening a migrated journal again changes nothing
        assert journal.count("trajectories") == 24


def test_a_schema_3_journal_gains_the_sent_tables(tmp_path):
    """A journal of schema 3 (before `sent_steps`) opens: the two tables are added, nothing else changes."""
    path = tmp_path / "journal.sqlite"
    Journal(path).close()
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE sent_sources")
        db.execute("DROP TABLE sent_steps")
        db.execute("UPDATE meta SET value='3' WHERE key='schema_version'")
    with Journal(path) as journal:
        assert journal.count("sent_steps") == 0 and journal.count("sent_sources") == 0
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == ("5",)


def test_a_schema_4_journal_gains_the_peers_per_prompt_column(tmp_path):
    """A journal of schema 4 opens: `sent_steps` gains `peers_per_prompt`, NULL (the configured value)
    in the steps it journaled, which read back as before."""
    path = tmp_path / "journal.sqlite"
    Journal(path).close()
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE sent_sources")
        db.execute("DROP TABLE sent_steps")
        for statement in SENT_TABLES_SQL.split(";"):
            db.execute(statement)
        db.execute("INSERT INTO sent_steps VALUES ('lab-a', 1, 5.0, NULL)")
        db.execute("INSERT INTO sent_sources VALUES ('lab-a', 1, 0, 'lab-a')")
        db.execute("UPDATE meta SET value='4' WHERE key='schema_version'")
    with Journal(path) as journal:
        assert journal.sent_step("lab-a", 1) == SentStep("lab-a", 1, 5.0, None, {0: frozenset({"lab-a"})}, None)
        journal.record_sent_step(SentStep("lab-a", 2, 6.0, 0, {1: frozenset({"lab-a"})}, 0))
        assert journal.sent_step("lab-a", 2).peers_per_prompt == 0
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == ("5",)


def test_a_journal_older_than_the_previous_schema_is_refused(tmp_path):
    """Only schemas 2, 3 and 4 migrate: a journal of schema 1 is one clear error and is left as it was."""
    path = tmp_path / "journal.sqlite"
    Journal(path).close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value='1' WHERE key='schema_version'")
    with pytest.raises(JournalError, match=r"has schema version 1, this hacfed reads 5"):
        Journal(path)
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == ("1",)


def _hashes(path):
    with sqlite3.connect(path) as db:
        return [r[0] for r in db.execute("SELECT content_hash FROM submissions")]


def test_corrupt_journal_is_one_clear_error(tmp_path):
    path = tmp_path / "journal.sqlite"
    path.write_bytes(b"this is not an SQLite file" * 100)
    with pytest.raises(JournalError, match=r"journal .*journal.sqlite cannot be used: file is not a database "
                                           r"\(the file is corrupt or not a hacfed journal"):
        Journal(path)

