"""The journal's SQL schema (version 5), its migrations, and the records read back from it.

Runs in the coordinator's ServerApp process (the Flower ServerApp that hacfed-server's SuperLink
starts, through `hacfed.server.driver`) and, in-process, in `hacfed sim`; `hacfed-server purge` and
`audit verify` open it too.

Version history (a journal of version 2, 3 or 4 is migrated in place when opened, step by step in one
transaction, `open_journal_db`; security.md R10; an older one is refused):
  1: the first release.
  2: trajectory ids are namespaced by their (authenticated) source: the key is
     (participant_id, trajectory_id), so one lab can no longer occupy the ids of another
     (issue 9, "trajectory-id squatting"); `trajectories.purged` marks samples withdrawn by
     `hacfed-server purge`.
  3: each distinct prompt is stored once, in `prompts`; a trajectory names it by `prompt_ref`
     (every lab answers the same prompts, G samples each: version 2 wrote the same prompt JSON
     G x labs times per round, about half of a submission's insert time, bench/coordinator_scale.py).
     The view `trajectory_rows` gives the rows with their `prompt_json`, as version 2 stored them.
  4: what each lab was sent at each step under `max_staleness` K >= 1 (`sent_steps`, `sent_sources`;
     `hacfed.server.coordinator.engine`), so a resend or a restarted coordinator sends the same
     update and no sample twice. A synchronous run (K = 0) writes nothing there.
  5: `sent_steps.peers_per_prompt`: how many peers per prompt the update was built with, fewer than
     `pool_peers_per_prompt` when it was cut to fit one message, so a rebuild cuts it the same
     (NULL in a step journaled by version 4: the configured `pool_peers_per_prompt`).
"""

from __future__ import annotations

import json
import math
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from hacfed.server.coordinator.errors import JournalError, describe_db_error
from hacfed.server.coordinator.validation import AcceptedTrajectory, Rejection
from hacfed.trajectory import ChatMessage, Trajectory

SCHEMA_VERSION = 5
SYNCHRONOUS_FULL = 2  # PRAGMA synchronous reads back as an integer

SENT_TABLES_SQL = """
CREATE TABLE sent_steps (
    participant_id TEXT NOT NULL,
    step INTEGER NOT NULL,               -- the round whose plan it rolls out, or `rounds`: the final update
    sent_at REAL NOT NULL,               -- when its update was built, before it was first sent
    capabilities_round INTEGER,          -- the closed round whose P̂ it carries (NULL: none had closed)
    PRIMARY KEY (participant_id, step)
);
CREATE TABLE sent_sources (
    participant_id TEXT NOT NULL,
    step INTEGER NOT NULL,
    round_id INTEGER NOT NULL,
    source_id TEXT NOT NULL,             -- the lab whose accepted samples of round_id it was sent
    PRIMARY KEY (participant_id, round_id, source_id),
    FOREIGN KEY (participant_id, step) REFERENCES sent_steps (participant_id, step)
)
"""
# Schema 5: the peers per prompt a step's update was built with (`sent_steps`: NULL, the configured
# `pool_peers_per_prompt`, in a step journaled by schema 4); a new journal gets it the same way.
PEERS_COLUMN_SQL = "ALTER TABLE sent_steps ADD COLUMN peers_per_prompt INTEGER"
SCHEMA_SQL = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE rounds (
    round_id INTEGER PRIMARY KEY,
    state TEXT NOT NULL CHECK (state IN ('OPEN', 'CLOSED', 'PUBLISHED')),
    opened_at REAL NOT NULL,
    deadline REAL NOT NULL,              -- wall-clock epoch seconds
    extensions INTEGER NOT NULL DEFAULT 0,
    closed_at REAL,
    close_reason TEXT CHECK (close_reason IN ('quorum', 'deadline')),
    below_quorum INTEGER,
    plan_json TEXT NOT NULL,
    capabilities_json TEXT,              -- P̂ after this round's update
    tracker_json TEXT                    -- CapabilityTracker.state_dict() after this round's update
);
CREATE TABLE participants (
    participant_id TEXT PRIMARY KEY,
    joined_at REAL NOT NULL,
    last_seen REAL NOT NULL,
    strikes INTEGER NOT NULL DEFAULT 0,
    quarantined INTEGER NOT NULL DEFAULT 0,
    quarantined_round INTEGER
);
CREATE TABLE submissions (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    participant_id TEXT NOT NULL REFERENCES participants (participant_id),
    round_id INTEGER NOT NULL REFERENCES rounds (round_id),
    content_hash TEXT NOT NULL UNIQUE,
    nonce TEXT NOT NULL,
    n_bytes INTEGER NOT NULL,
    received_at REAL NOT NULL,
    result_json TEXT NOT NULL,
    UNIQUE (participant_id, round_id)
);
CREATE UNIQUE INDEX submissions_nonce ON submissions (participant_id, nonce) WHERE nonce != '';
CREATE TABLE prompts (
    id INTEGER PRIMARY KEY,
    prompt_json TEXT NOT NULL UNIQUE     -- the chat messages, [{"role": ..., "content": ...}, ...]
);
CREATE TABLE trajectories (
    trajectory_id TEXT NOT NULL,         -- unique per source only: ids live in the source's namespace
    submission_seq INTEGER NOT NULL REFERENCES submissions (seq),
    participant_id TEXT NOT NULL,
    round_id INTEGER NOT NULL,
    prompt_id TEXT NOT NULL,
    prompt_pos INTEGER NOT NULL,
    idx INTEGER NOT NULL,
    prompt_ref INTEGER NOT NULL REFERENCES prompts (id),
    response_text TEXT NOT NULL,
    reward REAL NOT NULL,                -- verified
    claimed_reward REAL NOT NULL,
    source_logp_sum REAL NOT NULL,
    source_token_count INTEGER NOT NULL,
    finish_reason TEXT NOT NULL,
    policy_version INTEGER NOT NULL,
    purged INTEGER NOT NULL DEFAULT 0,   -- withdrawn by `hacfed-server purge`: never published again
    PRIMARY KEY (participant_id, trajectory_id),
    UNIQUE (participant_id, round_id, prompt_id, idx)
);
CREATE INDEX trajectories_round ON trajectories (round_id);
CREATE VIEW trajectory_rows AS SELECT t.*, p.prompt_json FROM trajectories t JOIN prompts p ON p.id = t.prompt_ref;
CREATE TABLE rejections (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    participant_id TEXT,
    round_id INTEGER,
    submission_seq INTEGER,
    trajectory_id TEXT,
    code TEXT NOT NULL,
    detail TEXT NOT NULL,
    at REAL NOT NULL
);
CREATE INDEX rejections_round ON rejections (round_id, participant_id);
CREATE TABLE strikes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    participant_id TEXT NOT NULL,
    round_id INTEGER NOT NULL,
    trajectory_id TEXT,
    code TEXT NOT NULL,
    at REAL NOT NULL
);
CREATE TABLE metrics (
    participant_id TEXT NOT NULL,
    round_id INTEGER NOT NULL,           -- the round whose submission carried the report
    report_json TEXT NOT NULL,
    PRIMARY KEY (participant_id, round_id)
);
CREATE TABLE events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    kind TEXT NOT NULL,                  -- quarantine | deadline_extended | closed_below_quorum | ...
    participant_id TEXT,
    round_id INTEGER,
    detail TEXT NOT NULL
);
""" + SENT_TABLES_SQL + ";\n" + PEERS_COLUMN_SQL


# Statements that bring a journal of version N (the key) to version N + 1; a journal of any version
# listed is brought to the current one step by step, in one transaction; an older one is refused (its
# release's hacfed migrates it first).
MIGRATIONS: dict[int, tuple[str, ...]] = {
    2: (
        # Each distinct prompt once, then the table rebuilt with a reference in place of the JSON.
        "CREATE TABLE prompts (id INTEGER PRIMARY KEY, prompt_json TEXT NOT NULL UNIQUE)",
        "INSERT OR IGNORE INTO prompts (prompt_json) SELECT prompt_json FROM trajectories ORDER BY rowid",
        "ALTER TABLE trajectories RENAME TO trajectories_v2",
        "DROP INDEX trajectories_round",
        """CREATE TABLE trajectories (
            trajectory_id TEXT NOT NULL, submission_seq INTEGER NOT NULL REFERENCES submissions (seq),
            participant_id TEXT NOT NULL, round_id INTEGER NOT NULL, prompt_id TEXT NOT NULL,
            prompt_pos INTEGER NOT NULL, idx INTEGER NOT NULL, prompt_ref INTEGER NOT NULL REFERENCES prompts (id),
            response_text TEXT NOT NULL, reward REAL NOT NULL, claimed_reward REAL NOT NULL,
            source_logp_sum REAL NOT NULL, source_token_count INTEGER NOT NULL, finish_reason TEXT NOT NULL,
            policy_version INTEGER NOT NULL, purged INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (participant_id, trajectory_id), UNIQUE (participant_id, round_id, prompt_id, idx)
        )""",
        "INSERT INTO trajectories SELECT t.trajectory_id, t.submission_seq, t.participant_id, t.round_id, "
        "t.prompt_id, t.prompt_pos, t.idx, p.id, t.response_text, t.reward, t.claimed_reward, t.source_logp_sum, "
        "t.source_token_count, t.finish_reason, t.policy_version, t.purged "
        "FROM trajectories_v2 t JOIN prompts p ON p.prompt_json = t.prompt_json ORDER BY t.rowid",
        "DROP TABLE trajectories_v2",
        "CREATE INDEX trajectories_round ON trajectories (round_id)",
        "CREATE VIEW trajectory_rows AS SELECT t.*, p.prompt_json FROM trajectories t "
        "JOIN prompts p ON p.id = t.prompt_ref",
    ),
    3: tuple(sql.strip() for sql in SENT_TABLES_SQL.split(";") if sql.strip()),
    4: (PEERS_COLUMN_SQL,),
}


def open_journal_db(path: Path) -> sqlite3.Connection:
    """The journal's connection: WAL, `synchronous=FULL`, foreign keys on, the schema created (a new
    file) or migrated from an earlier version; `JournalError` naming the file when it cannot be."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    except (OSError, sqlite3.Error) as exc:
        raise JournalError(f"journal {path} cannot be opened: {describe_db_error(exc)}") from None
    db.row_factory = sqlite3.Row
    try:
        mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        db.execute("PRAGMA synchronous=FULL")
        db.execute("PRAGMA foreign_keys=ON")
        sync = db.execute("PRAGMA synchronous").fetchone()[0]
        if str(mode).lower() != "wal" or sync != SYNCHRONOUS_FULL:
            raise JournalError(f"journal {path}: need journal_mode=wal and synchronous=FULL, got {mode!r}/{sync!r}")
        db.execute("BEGIN IMMEDIATE")
        try:
            _init_schema(db, path)
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
    except sqlite3.Error as exc:
        db.close()
        raise JournalError(f"journal {path} cannot be used: {describe_db_error(exc)}") from None
    except JournalError:
        db.close()
        raise
    return db


def _init_schema(db: sqlite3.Connection, path: Path) -> None:
    """Inside the open transaction: create the schema in a new file, or migrate the previous one."""
    has_meta = db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'").fetchone()
    if not has_meta:
        # One statement at a time: executescript() would COMMIT the open transaction.
        for statement in SCHEMA_SQL.split(";"):
            if statement.strip():
                db.execute(statement)
        db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        return
    row = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
    version = int(row[0]) if row and str(row[0]).isdigit() else None
    if version is None or version > SCHEMA_VERSION or (version < SCHEMA_VERSION and version not in MIGRATIONS):
        raise JournalError(f"journal {path} has schema version {version}, this hacfed reads {SCHEMA_VERSION}")
    if version < SCHEMA_VERSION:  # migrate in place, inside this one transaction
        for step in range(version, SCHEMA_VERSION):
            for statement in MIGRATIONS[step]:
                db.execute(statement)
        db.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION),))


@dataclass(frozen=True)
class SentStep:
    """One journaled update (`sent_steps` and its `sent_sources` rows): when it was first built, whose P̂
    it carries, the submissions it drew by round (with round_join "newest" also those it skipped), the
    peers per prompt of its share (None: the configured `pool_peers_per_prompt`)."""

    participant_id: str
    step: int
    sent_at: float
    capabilities_round: int | None
    sources: dict[int, frozenset[str]]
    peers_per_prompt: int | None = None


@dataclass(frozen=True)
class RoundRecord:
    round_id: int
    state: str
    opened_at: float
    deadline: float
    extensions: int
    closed_at: float | None
    close_reason: str | None
    below_quorum: bool | None
    plan_json: str
    capabilities: dict[str, float] | None
    tracker_state: dict | None


@dataclass(frozen=True)
class ParticipantRecord:
    participant_id: str
    joined_at: float
    last_seen: float
    strikes: int
    quarantined: bool
    quarantined_round: int | None


@dataclass(frozen=True)
class SubmissionRecord:
    """Everything one submission adds to the journal, written atomically by `record_submission`."""

    participant_id: str
    round_id: int
    content_hash: str
    nonce: str
    n_bytes: int
    received_at: float
    accepted: tuple[AcceptedTrajectory, ...]
    rejections: tuple[Rejection, ...]
    strikes: tuple[Rejection, ...]
    quarantine: bool
    report_json: str | None



def round_record(row: sqlite3.Row) -> RoundRecord:
    return RoundRecord(
        round_id=row["round_id"], state=row["state"], opened_at=row["opened_at"], deadline=row["deadline"],
        extensions=row["extensions"], closed_at=row["closed_at"], close_reason=row["close_reason"],
        below_quorum=None if row["below_quorum"] is None else bool(row["below_quorum"]),
        plan_json=row["plan_json"],
        capabilities=json.loads(row["capabilities_json"]) if row["capabilities_json"] else None,
        tracker_state=json.loads(row["tracker_json"]) if row["tracker_json"] else None,
    )


def participant_record(row: sqlite3.Row) -> ParticipantRecord:
    return ParticipantRecord(
        participant_id=row["participant_id"], joined_at=row["joined_at"], last_seen=row["last_seen"],
        strikes=row["strikes"], quarantined=bool(row["quarantined"]), quarantined_round=row["quarantined_round"],
    )


def trajectory_row(seq: int, round_id: int, a: AcceptedTrajectory, prompt_ref: int) -> tuple:
    """The row of an accepted trajectory; `prompt_ref`: the `prompts` id of its prompt (`prompt_json`)."""
    t = a.trajectory
    return (
        t.trajectory_id, seq, t.source_id, round_id, t.prompt_id, a.prompt_pos, a.idx, prompt_ref, t.response_text,
        float(t.reward), float(a.claimed_reward), float(t.source_logp_sum), t.source_token_count, t.finish_reason,
        t.policy_version,
    )


def prompt_json(prompt: tuple[ChatMessage, ...]) -> str:
    """How a prompt is stored (`prompts.prompt_json`)."""
    return json.dumps([m.as_dict() for m in prompt], ensure_ascii=False)


def as_journaled(pool: Sequence[Trajectory]) -> bool:
    """Whether every trajectory of `pool` is field for field what `Journal.pool` would build from its
    row: exact built-in types (SQLite gives back a float for REAL, an int for INTEGER, a str for
    TEXT, a prompt of ChatMessage of two strs) and no negative zero (which a REAL column does not
    keep, and which protobuf encodes differently). Each distinct prompt object is checked once."""
    prompts: set[int] = set()  # ids of prompts checked (every object is alive during the call)
    for t in pool:
        reward, lp = t.reward, t.source_logp_sum
        if not (
            type(reward) is float and type(lp) is float and type(t.source_token_count) is int
            and type(t.policy_version) is int and type(t.response_text) is str and type(t.trajectory_id) is str
            and type(t.prompt_id) is str and type(t.source_id) is str and type(t.finish_reason) is str
            and (reward != 0.0 or math.copysign(1.0, reward) > 0) and (lp != 0.0 or math.copysign(1.0, lp) > 0)
        ):
            return False
        prompt = t.prompt
        if id(prompt) not in prompts:
            if type(prompt) is not tuple or not all(
                    type(m) is ChatMessage and type(m.role) is str and type(m.content) is str for m in prompt):
                return False
            prompts.add(id(prompt))
    return True
