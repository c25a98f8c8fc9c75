"""A lab's outbox: each signed submission is kept until the coordinator answers it (security.md "Nothing lost", R5).

Runs in a lab's hacfed-client process, inside the participant service (`hacfed.clients.service`);
`hacfed-client replay` reads the round updates it kept.

    outbox = Outbox(state_dir / "outbox.sqlite")
    outbox.add(key, round_id=3, nonce=sub.nonce, envelope=sealed)   # before the checkpoint that covers it
    outbox.pending()                                                # what to resend, oldest first
    outbox.settle(nonce, "acked", answer=receipt_envelope)          # the coordinator's signed receipt

One SQLite file (WAL, synchronous=FULL): a row per answered round update, keyed by the update
(run id, pool round, plan round), holding the exact signed bytes that were sent, so a resend is
byte-identical and carries the same nonce (the coordinator answers it with the original receipt).
States: `pending` (no answer yet: resent with every reply), `acked` (the coordinator's signed
receipt is stored), `refused` (its signed refusal is stored, with the code). A refusal with a
retry-after (a rate limit or a quota) leaves the entry pending.

Durability with the checkpoint (the lost round of issue 9): the entry is written BEFORE the
participant's checkpoint of the same step, and the reply leaves only after both. At start-up,
`discard_uncovered` drops pending entries that no checkpoint covers: their step died before its
checkpoint, so they were never sent, and the coordinator's retried update is answered by a new step
from the checkpoint. An entry that a checkpoint covers is always resent as is, never recomputed.

The table `received` keeps every signed round update the lab answered (the pools it trained on), so
a purge can be replayed locally (`hacfed.clients.replay`).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal

UpdateKey = tuple[str, int | None, int | None]  # (run id, pool round, plan round)
STATES = ("pending", "acked", "refused")
KEEP_ACKED_ENVELOPES = 8  # acknowledged entries whose signed bytes are kept (the rest: answer only)

SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    update_key TEXT NOT NULL UNIQUE,
    run_id TEXT NOT NULL,
    round_id INTEGER NOT NULL,
    nonce TEXT NOT NULL,
    envelope BLOB,                       -- the signed Submission as sent (NULL once pruned after its ack)
    created_at REAL NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'acked', 'refused')),
    answer BLOB,                         -- the coordinator's signed receipt or refusal
    code TEXT,
    detail TEXT,
    answered_at REAL,
    sends INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS outbox_nonce ON outbox (nonce);
CREATE TABLE IF NOT EXISTS received (
    update_key TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    pool_round INTEGER,
    plan_round INTEGER,
    envelope BLOB NOT NULL,              -- the coordinator's signed RoundUpdate
    received_at REAL NOT NULL
);
"""


@dataclass(frozen=True)
class OutboxEntry:
    key: UpdateKey
    round_id: int
    nonce: str
    envelope: bytes | None
    state: str
    answer: bytes | None
    code: str | None
    detail: str | None
    sends: int


class OutboxError(ValueError):
    """The outbox file cannot be used (corrupt, read-only, ...): hacfed-client says so in one line."""


def encode_key(key: UpdateKey) -> str:
    return json.dumps(list(key))


def decode_key(text: str) -> UpdateKey:
    run_id, pool_round, plan_round = json.loads(text)
    return (run_id, pool_round, plan_round)


class Outbox:
    def __init__(self, path: str | Path, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self._clock = clock
        self._lock = threading.RLock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    self._db.execute(statement)
        except (OSError, sqlite3.Error) as exc:
            corrupt = "not a database" in str(exc)
            hint = " (corrupt: move it away; its unanswered submissions are lost)" if corrupt else ""
            raise OutboxError(f"outbox {self.path} cannot be used: {exc}{hint}") from None
        self._db.row_factory = sqlite3.Row

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def pragma(self, name: str) -> object:
        if name not in ("journal_mode", "synchronous"):
            raise ValueError(f"unsupported pragma {name!r}")
        with self._lock:
            return self._db.execute(f"PRAGMA {name}").fetchone()[0]

    # -- submissions ----------------------------------------------------------------------------

    def add(self, key: UpdateKey, round_id: int, nonce: str, envelope: bytes) -> None:
        """Keep a signed submission (pending) before anything that makes it sendable."""
        with self._lock:
            self._db.execute(
                "INSERT INTO outbox (update_key, run_id, round_id, nonce, envelope, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (encode_key(key), key[0], round_id, nonce, envelope, self._clock()),
            )

    def entry_for(self, key: UpdateKey) -> OutboxEntry | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM outbox WHERE update_key=?", (encode_key(key),)).fetchone()
        return _entry(row) if row else None

    def by_nonce(self, nonce: str) -> OutboxEntry | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM outbox WHERE nonce=? ORDER BY id DESC LIMIT 1", (nonce,)).fetchone()
        return _entry(row) if row else None

    def pending(self, exclude: UpdateKey | None = None, limit: int = 16) -> list[OutboxEntry]:
        """Unanswered entries, oldest first (what a reply resends)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT * FROM outbox WHERE state='pending' AND update_key != ? ORDER BY id LIMIT ?",
                (encode_key(exclude) if exclude else "", limit),
            ).fetchall()
        return [_entry(r) for r in rows]

    def mark_sent(self, keys: list[UpdateKey]) -> None:
        with self._lock:
            self._db.executemany("UPDATE outbox SET sends=sends+1 WHERE update_key=?", [(encode_key(k),) for k in keys])

    def settle(
        self, nonce: str, state: Literal["acked", "refused"], answer: bytes, code: str | None = None,
        detail: str | None = None,
    ) -> OutboxEntry | None:
        """Record the coordinator's answer for the entry with this nonce; returns the entry as it
        was before (None when no entry has this nonce). A second answer for a settled entry is
        not stored (the first one is kept; the caller compares them)."""
        if state not in ("acked", "refused"):
            raise ValueError(f"state must be acked or refused, got {state!r}")
        with self._lock:
            before = self.by_nonce(nonce)
            if before is None or before.state != "pending":
                return before
            self._db.execute(
                "UPDATE outbox SET state=?, answer=?, code=?, detail=?, answered_at=? "
                "WHERE nonce=? AND state='pending'",
                (state, answer, code, detail, self._clock(), nonce),
            )
            self._prune()
            return before

    def discard(self, key: UpdateKey) -> None:
        """Drop a pending entry that was never sent (its step failed before the reply left)."""
        with self._lock:
            self._db.execute(
                "DELETE FROM outbox WHERE update_key=? AND state='pending' AND sends=0", (encode_key(key),)
            )

    def discard_uncovered(self, covered: Callable[[UpdateKey], bool]) -> list[UpdateKey]:
        """At start-up: drop pending entries no checkpoint covers (never sent, see the docstring)."""
        with self._lock:
            rows = self._db.execute("SELECT update_key FROM outbox WHERE state='pending'").fetchall()
            dropped = [decode_key(r[0]) for r in rows if not covered(decode_key(r[0]))]
            self._db.executemany("DELETE FROM outbox WHERE update_key=?", [(encode_key(k),) for k in dropped])
        return dropped

    def entries(self) -> list[OutboxEntry]:
        """Every entry, oldest first."""
        with self._lock:
            rows = self._db.execute("SELECT * FROM outbox ORDER BY id").fetchall()
        return [_entry(r) for r in rows]

    def counts(self) -> dict[str, int]:
        with self._lock:
            rows = self._db.execute("SELECT state, COUNT(*) FROM outbox GROUP BY state").fetchall()
        return {state: 0 for state in STATES} | {r[0]: int(r[1]) for r in rows}

    def _prune(self) -> None:
        self._db.execute(
            "UPDATE outbox SET envelope=NULL WHERE state!='pending' AND id NOT IN "
            "(SELECT id FROM outbox WHERE state!='pending' ORDER BY id DESC LIMIT ?)", (KEEP_ACKED_ENVELOPES,),
        )

    # -- received round updates (for replay) ----------------------------------------------------

    def remember_update(self, key: UpdateKey, envelope: bytes) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR IGNORE INTO received VALUES (?, ?, ?, ?, ?, ?)",
                (encode_key(key), key[0], key[1], key[2], envelope, self._clock()),
            )

    def received_updates(self, run_id: str | None = None) -> list[tuple[UpdateKey, bytes]]:
        """Every kept round update (of one run, if given), in the order of their pool rounds."""
        with self._lock:
            rows = self._db.execute(
                "SELECT update_key, envelope FROM received WHERE ? IS NULL OR run_id=? "
                "ORDER BY COALESCE(pool_round, -1), COALESCE(plan_round, 1 << 62)", (run_id, run_id),
            ).fetchall()
        return [(decode_key(r[0]), bytes(r[1])) for r in rows]


def _entry(row: sqlite3.Row) -> OutboxEntry:
    return OutboxEntry(
        key=decode_key(row["update_key"]), round_id=int(row["round_id"]), nonce=row["nonce"],
        envelope=None if row["envelope"] is None else bytes(row["envelope"]), state=row["state"],
        answer=None if row["answer"] is None else bytes(row["answer"]), code=row["code"], detail=row["detail"],
        sends=int(row["sends"]),
    )
