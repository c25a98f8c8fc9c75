"""The audit log's tail, witnessed by the journal (security.md S10).

Every audit line the journal writes (`Journal._audit`) also records its sequence number and hash
in the journal's `meta` table, in the same transaction as the decision it records. `hacfed-server
audit verify` reads it back (`read_tail`) and checks that the log still holds that line with that
hash (`verify_audit_log(..., journal_tail=...)`), so lines deleted from the end of the log are found
even when the signed head file was replaced by an older copy or rewritten with the key. Lines the
operator's commands append without the journal (`register`, `revoke`) may follow the recorded tail.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any, NamedTuple

TAIL_KEY = "audit_tail"


class AuditTail(NamedTuple):
    lines: int  # the sequence number (1-based line) of the last line the journal recorded
    hash: str  # that line's hash


def record_tail(db: sqlite3.Connection, line: dict[str, Any]) -> None:
    """Inside the journal transaction that wrote `line` (what `AuditLog.append` returned)."""
    value = f"{int(line['id'])} {line['hash']}"
    db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (TAIL_KEY, value))


def read_tail(journal_path: Path) -> AuditTail | None:
    """The tail the journal at `journal_path` recorded (opened read-only); None when it recorded none.
    Raises ValueError (one line) for a journal that cannot be read or holds a malformed tail."""
    try:
        db = sqlite3.connect(f"file:{Path(journal_path)}?mode=ro", uri=True)
        try:
            row = db.execute("SELECT value FROM meta WHERE key=?", (TAIL_KEY,)).fetchone()
        finally:
            db.close()
    except sqlite3.Error as exc:
        raise ValueError(f"journal {journal_path}: its audit tail cannot be read: {exc}") from None
    if row is None:
        return None
    try:
        lines, last_hash = str(row[0]).split(" ")
        tail = AuditTail(int(lines), last_hash)
    except ValueError:
        raise ValueError(f"journal {journal_path}: malformed audit tail {str(row[0])[:80]!r}") from None
    if tail.lines < 1 or len(tail.hash) != 64:
        raise ValueError(f"journal {journal_path}: malformed audit tail {str(row[0])[:80]!r}")
    return tail
