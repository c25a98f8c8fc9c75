"""hacfed-server pauses while its state dir's writes fail for lack of space (issue 42 H1; security.md H1).

`SpacePause` with an injected probe and clocks; `probe_space` against a real directory whose
free space is faked; `hold_open_deadlines` against a real journal. The end-to-end check (a tmpfs
filled by another process while a round is open) is tests/integration/test_state_dir_filled.py.
"""

from __future__ import annotations

import errno
import shutil
import sqlite3
from pathlib import Path

import pytest

from hacfed.keys import ensure_key_pair
from hacfed.server.coordinator import Journal
from hacfed.server.coordinator.audit import AuditLog, verify_audit_log
from hacfed.server.coordinator.errors import AuditError, JournalWriteError
from hacfed.server.disk_space import FIRST_RETRY_S, SpacePause, hold_open_deadlines
from hacfed.server.headroom import CHECK_INTERVAL_S, HEALTHY_PROBE_S, PROBE_FILE, DiskUsage, is_no_space, probe_space


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Probe:
    """A probe whose answer the test sets; counts its calls."""

    def __init__(self) -> None:
        self.problem: str | None = None
        self.calls = 0

    def __call__(self, state_dir: Path) -> str | None:
        self.calls += 1
        return self.problem


def test_a_write_that_fails_for_lack_of_space_is_recognised_and_no_other() -> None:
    assert is_no_space(OSError(errno.ENOSPC, "No space left on device"))
    assert is_no_space(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert is_no_space(JournalWriteError("journal j cannot be written: database or disk is full (the disk is full)"))
    assert is_no_space(AuditError("audit log a cannot be written: [Errno 28] No space left on device"))
    assert is_no_space(sqlite3.OperationalError("database or disk is full"))
    assert not is_no_space(OSError(errno.EACCES, "Permission denied"))
    assert not is_no_space(JournalWriteError("journal j cannot be written: attempt to write a readonly database"))


def test_paused_once_retried_with_backoff_and_resumed_with_the_time_paused() -> None:
    mono, wall, probe, lines = Clock(), Clock(), Probe(), []
    pause = SpacePause(Path("state"), lines.append, mono, wall, probe=probe)
    assert pause.check() is None and not pause.paused and probe.calls == 1
    mono.t += HEALTHY_PROBE_S / 2
    assert pause.check() is None and probe.calls == 1  # healthy: probed every HEALTHY_PROBE_S only
    probe.problem = "a write of 256 KiB to the state dir state fails: No space left on device"
    assert pause.check(now_needed=True) is None and pause.paused and probe.calls == 2  # the ServerApp ended
    assert len(lines) == 1 and lines[0].startswith(f"PAUSED: {probe.problem}; ") and "not restarted" in lines[0]
    waits = []
    for _ in range(6):  # still full: asked again after 1, 2, 4, 5, 5 ... s, and said once
        before = probe.calls
        while probe.calls == before:
            mono.t += 0.25
            wall.t += 0.25
            assert pause.check() is None
        waits.append(mono.t)
    gaps = [b - a for a, b in zip(waits, waits[1:])]
    assert gaps == [2 * FIRST_RETRY_S, 4 * FIRST_RETRY_S, CHECK_INTERVAL_S, CHECK_INTERVAL_S, CHECK_INTERVAL_S]
    assert len(lines) == 1 and pause.paused
    probe.problem = None
    while (ended := pause.check()) is None:
        mono.t += 0.25
        wall.t += 0.25
    since, paused_s = ended
    assert not pause.paused and since == 1000.0 and paused_s == pytest.approx(wall.t - since)
    assert lines[1] == f"resumed: the state dir state can be written again (paused {paused_s:.0f}s)"


def test_the_probe_writes_only_when_free_space_is_low_and_names_the_failure(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "disk_usage", lambda path: DiskUsage(1 << 40, 0, 1 << 40))
    monkeypatch.setattr("os.open", lambda *a, **k: pytest.fail("wrote with plenty of space"))
    assert probe_space(tmp_path) is None
    monkeypatch.undo()
    monkeypatch.setattr(shutil, "disk_usage", lambda path: DiskUsage(1 << 30, 1 << 30, 4096))
    assert probe_space(tmp_path) is None and not (tmp_path / PROBE_FILE).exists()  # written, synced, removed

    def full(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("os.write", full)
    problem = probe_space(tmp_path)
    assert problem is not None and str(tmp_path) in problem and "No space left on device" in problem
    assert not (tmp_path / PROBE_FILE).exists()


def test_holding_moves_only_the_open_rounds_deadlines_and_is_audited(tmp_path: Path) -> None:
    ensure_key_pair(tmp_path, "coordinator")
    journal_path, audit_path = tmp_path / "journal.sqlite", tmp_path / "audit.log"
    with Journal(journal_path, audit=AuditLog(audit_path)) as journal:
        journal.bind_run("r", {"plan": 1})
        journal.insert_round(0, 10.0, 110.0, "{}")
        journal.close_round(0, "quorum", 20.0, False, {}, {})
        journal.insert_round(1, 20.0, 120.0, "{}")
    assert hold_open_deadlines(journal_path, audit_path, 150.0, 42.5, 200.0) == [1]
    assert hold_open_deadlines(journal_path, audit_path, 150.0, 42.5, 210.0) == []  # that pause is held already
    with Journal(journal_path) as journal:
        assert journal.round(0).deadline == 110.0 and journal.round(1).deadline == 162.5
        assert journal.round(1).extensions == 0
        assert [(e["kind"], e["round_id"]) for e in journal.events("deadline_held")] == [("deadline_held", 1)]
    assert verify_audit_log(audit_path).ok
    assert '"deadline_held"' in audit_path.read_text()
