"""A journal write that fails (full disk, file-size limit) takes the fail-closed path (issue 31; security.md S10).

Before, SQLite's `OperationalError` escaped the driver raw; the ServerApp died with a traceback. Now
the transaction is rolled back, the coordinator fails closed exactly as when its audit log cannot be
written (`JournalWriteError` is an `AuditError`), the console says so in one line, and a restarted
coordinator accepts the lab's resend from its outbox.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hacfed.server.coordinator.errors import ErrorCode
from hacfed.server.driver import FailedClosed
from tests.unit.test_coordinator_fakes import FakeClock, scripted_submission
from tests.unit.test_server_driver import Federation


class FullDisk:
    """The journal's connection, whose COMMIT fails as on a full disk."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def execute(self, sql: str, *args: object) -> sqlite3.Cursor:
        if sql.strip().upper().startswith("COMMIT"):
            raise sqlite3.OperationalError("database or disk is full")
        return self._db.execute(sql, *args)

    def __getattr__(self, name: str) -> object:
        return getattr(self._db, name)


def test_a_journal_write_that_fails_mid_reply_fails_closed_in_one_line(tmp_path: Path) -> None:
    clock = FakeClock()
    fed = Federation(tmp_path, clock, expected_participants=1)
    fed.add(1, "lab-a")
    payloads = fed.driver.next_round(fed.identified())  # round 0 opened and sent
    assert payloads is not None and set(payloads) == {1}
    reply = fed.nodes[1][1].handle(payloads[1])
    journal = fed.driver.journal
    real = journal._db
    journal._db = FullDisk(real)
    with pytest.raises(FailedClosed, match="journal .* cannot be written: database or disk is full"):
        fed.driver.on_replies([(1, reply)])
    journal._db = real
    assert fed.driver.coordinator.failed_closed.startswith(f"journal {journal.path} cannot be written")
    failed = [line for line in fed.lines if line.startswith("WRITE FAILED: ")]
    assert len(failed) == 1 and "(the disk is full)" in failed[0], fed.lines
    assert "hacfed-server pauses and runs it again" in failed[0], failed  # no space: no restart by hand (H1)
    assert journal.count("submissions") == 0 and not real.in_transaction  # rolled back
    plan = fed.driver.coordinator.plan_for(0)
    refused = fed.driver.coordinator.submit(scripted_submission(plan, "lab-a"))  # the disk has room again:
    assert refused.refusal == ErrorCode.AUDIT_UNAVAILABLE  # still closed until restarted
    fed.driver = fed.new_driver()  # the restart: the lab's outbox resends its submission
    fed.run()
    assert fed.driver.coordinator.finished and fed.driver.journal.count("submissions") >= 2


def test_a_file_size_limit_on_the_journal_is_a_journal_write_error(tmp_path: Path) -> None:
    """A real failure: RLIMIT_FSIZE at the journal's current size, in a child process (so the limit
    touches nothing else); Python ignores SIGXFSZ, so SQLite's write gets EFBIG."""
    code = textwrap.dedent(f"""
        import os, resource
        from hacfed.server.coordinator.errors import JournalWriteError
        from hacfed.server.coordinator.journal import Journal
        journal = Journal({str(tmp_path / "journal.sqlite")!r})
        journal.insert_round(0, 1.0, 2.0, "[]")
        biggest = max(os.path.getsize(entry.path) for entry in os.scandir({str(tmp_path)!r}))
        resource.setrlimit(resource.RLIMIT_FSIZE, (biggest + 1024, resource.RLIM_INFINITY))
        try:
            journal.insert_round(1, 1.0, 2.0, "x" * 300_000)
        except JournalWriteError as exc:
            print("JournalWriteError:", exc)
        print("rounds:", journal.count("rounds"))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"JournalWriteError: journal {tmp_path / 'journal.sqlite'} cannot be written: "), \
        done.stdout
    assert done.stdout.strip().endswith("rounds: 1"), done.stdout  # the failed round was rolled back


def test_a_deadline_extension_that_cannot_be_written_fails_closed(tmp_path: Path) -> None:
    """The round loop's `close_round` extends a passed deadline below quorum: a journal write too."""
    clock = FakeClock()
    fed = Federation(tmp_path, clock, expected_participants=1)
    fed.add(1, "lab-a")
    assert fed.driver.next_round(fed.identified())  # round 0 opened and sent; no reply comes
    journal = fed.driver.journal
    journal._db = FullDisk(journal._db)
    clock.t += fed.config.coordinator.round_deadline_s + 1
    with pytest.raises(FailedClosed, match="journal .* cannot be written"):
        fed.driver.close_round()
    assert sum(line.startswith("WRITE FAILED: ") for line in fed.lines) == 1
