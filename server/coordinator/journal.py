"""The coordinator's durable journal: one SQLite file, WAL, `synchronous=FULL` (security.md "Nothing lost").

Runs in the coordinator's ServerApp process (`hacfed.server.driver`) and, in-process, in `hacfed sim`. hacfed-server
also opens it before it starts anything, to refuse a journal of another run.

Accepted ⇔ ACKed ⇔ durable: `record_submission` writes a submission's accepted trajectories, its rejections,
strikes and metrics in ONE transaction and returns only after the commit, so a receipt built from its return value
never precedes durability. The round state machine lives in the same file (OPEN -> CLOSED(quorum|deadline) ->
PUBLISHED) together with the capability tracker's state at each close, so a restarted coordinator replays exactly
what was decided and counts nothing twice.

Uniqueness the schema enforces (T4): one recorded submission per (participant, round) and per content hash, one per
(participant, nonce) when a nonce is set, one row per (participant, trajectory id) and per (participant, round,
prompt, sample index). Each distinct prompt is stored once (`prompts`, schema 3) and named by its trajectories.

Audit (security.md S10): with an `AuditLog`, every write that decides something (a submission accepted or refused,
a participant joining or quarantined, a round opened, extended or closed, a final report, a purge) appends one
hash-chained line INSIDE its transaction, before COMMIT. A line (or a journal write: `JournalWriteError`) that
fails raises `AuditError` and rolls the decision back: nothing is decided that is not audited; the coordinator fails
closed. (A crash between the line and the COMMIT leaves a line for a decision that did not happen, never the reverse.)
"""

from __future__ import annotations

import json
import sqlite3
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, TypeVar

from hacfed.crashpoints import crash_point
from hacfed.server.coordinator.audit import AuditEvent, AuditLog
from hacfed.server.coordinator.audit_tail import record_tail
from hacfed.server.coordinator.errors import JournalError, journal_writes
from hacfed.server.coordinator.journal_reads import JournalReads
from hacfed.server.coordinator.journal_schema import (
    SCHEMA_VERSION,
    ParticipantRecord,
    RoundRecord,
    SentStep,
    SubmissionRecord,
    open_journal_db,
    participant_record,
    prompt_json,
    round_record,
    trajectory_row,
)
from hacfed.trajectory import Trajectory

T = TypeVar("T")
__all__ = ["Journal", "ParticipantRecord", "RoundRecord", "SentStep", "SubmissionRecord", "SCHEMA_VERSION"]


class Journal:
    """Thread-safe (one connection behind a lock); every write method is one transaction."""

    def __init__(self, path: str | Path, audit: AuditLog | None = None) -> None:
        self.path = Path(path)
        self.audit = audit
        self._lock = threading.RLock()
        self._last_versions: dict[str, int] = {}  # last_policy_version, once read (see there)
        self._prompt_ids: dict[str, int] = {}  # prompts.prompt_json -> id, for rows committed (`_prompt_refs`)
        self._db = open_journal_db(self.path)
        self._reads = JournalReads(self._db, self._lock)  # the queries that write nothing

    # -- lifecycle -------------------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> "Journal":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _audit(self, event: AuditEvent) -> None:
        """Append the decision's audit line; called inside its transaction (see the module docstring), which
        also records the line's number and hash (`audit_tail`: `audit verify` compares them with the log)."""
        if self.audit is not None:
            record_tail(self._db, self.audit.append(event))

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock, journal_writes(self.path):  # a failed write: JournalWriteError, the fail-closed path
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:  # (SQLite may have rolled back a failed COMMIT itself)
                    self._db.execute("ROLLBACK")
                raise

    def pragma(self, name: str) -> Any:
        if name not in ("journal_mode", "synchronous", "integrity_check", "foreign_keys"):
            raise ValueError(f"unsupported pragma {name!r}")
        with self._lock:
            return self._db.execute(f"PRAGMA {name}").fetchone()[0]

    def bind_run(self, run_id: str, fingerprint: dict[str, Any]) -> None:
        """Tie the journal to one run and its plan-deciding settings; refuse to mix experiments."""
        encoded = json.dumps(fingerprint, sort_keys=True)
        with self._tx() as db:
            rows = dict(db.execute("SELECT key, value FROM meta").fetchall())
            if "run_id" not in rows:
                db.execute("INSERT INTO meta VALUES ('run_id', ?), ('plan_fingerprint', ?)", (run_id, encoded))
                return
        if rows["run_id"] != run_id:
            raise JournalError(f"journal {self.path} belongs to run {rows['run_id']!r}, not {run_id!r}")
        stored = json.loads(rows["plan_fingerprint"])
        changed = sorted(k for k in set(stored) | set(fingerprint) if stored.get(k) != fingerprint.get(k))
        if changed:
            raise JournalError(
                f"journal {self.path}: run {run_id!r} was started with different {changed}; "
                "these settings decide the prompt plans and cannot change mid-run (use a new run_id)"
            )

    # -- rounds ----------------------------------------------------------------------------------

    def insert_round(self, round_id: int, opened_at: float, deadline: float, plan_json: str) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO rounds (round_id, state, opened_at, deadline, plan_json) VALUES (?, 'OPEN', ?, ?, ?)",
                (round_id, opened_at, deadline, plan_json),
            )
            self._audit(AuditEvent("round_open", round_id=round_id, detail=f"deadline {deadline:.3f}"))

    def round(self, round_id: int) -> RoundRecord | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM rounds WHERE round_id=?", (round_id,)).fetchone()
        return round_record(row) if row else None

    def latest_round(self) -> RoundRecord | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM rounds ORDER BY round_id DESC LIMIT 1").fetchone()
        return round_record(row) if row else None

    def latest_closed_round(self) -> RoundRecord | None:
        with self._lock:
            row = self._db.execute(
                "SELECT * FROM rounds WHERE state != 'OPEN' ORDER BY round_id DESC LIMIT 1"
            ).fetchone()
        return round_record(row) if row else None

    def extend_deadline(self, round_id: int, deadline: float, now: float, detail: str) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE rounds SET deadline=?, extensions=extensions+1 WHERE round_id=? AND state='OPEN'",
                (deadline, round_id),
            )
            _event(db, now, "deadline_extended", None, round_id, detail)
            self._audit(AuditEvent("deadline_extended", round_id=round_id, code="below_quorum", detail=detail))

    def hold_deadlines(self, by_s: float, now: float, detail: str) -> list[int]:
        """Move every open round's deadline `by_s` later (the coordinator was paused for lack of space:
        hacfed.server.headroom); returns those rounds. Not an extension: `extensions` is unchanged."""
        with self._tx() as db:
            held = [r for (r,) in db.execute("SELECT round_id FROM rounds WHERE state='OPEN' ORDER BY round_id")]
            db.execute("UPDATE rounds SET deadline=deadline+? WHERE state='OPEN'", (by_s,))
            for round_id in held:
                _event(db, now, "deadline_held", None, round_id, detail)
                self._audit(AuditEvent("deadline_held", round_id=round_id, code="paused", detail=detail))
        return held

    def close_round(
        self, round_id: int, reason: str, closed_at: float, below_quorum: bool,
        capabilities: dict[str, float], tracker_state: dict,
    ) -> None:
        with self._tx() as db:
            cur = db.execute(
                "UPDATE rounds SET state='CLOSED', close_reason=?, closed_at=?, below_quorum=?, "
                "capabilities_json=?, tracker_json=? WHERE round_id=? AND state='OPEN'",
                (reason, closed_at, int(below_quorum), json.dumps(capabilities), json.dumps(tracker_state), round_id),
            )
            if cur.rowcount != 1:
                raise JournalError(f"round {round_id} is not open in the journal; cannot close it")
            if below_quorum:
                _event(db, closed_at, "closed_below_quorum", None, round_id, f"closed by {reason} below quorum")
            self._audit(AuditEvent("round_close", round_id=round_id, code=reason,
                                   detail=f"capabilities {json.dumps(capabilities, sort_keys=True)}"
                                          f"{'; below quorum' if below_quorum else ''}"))
            crash_point("mid_round_close")

    def mark_published(self, round_id: int) -> None:
        with self._tx() as db:
            db.execute("UPDATE rounds SET state='PUBLISHED' WHERE round_id=? AND state='CLOSED'", (round_id,))

    # -- participants ----------------------------------------------------------------------------

    def upsert_participant(self, participant_id: str, now: float) -> ParticipantRecord:
        with self._tx() as db:
            known = db.execute("SELECT 1 FROM participants WHERE participant_id=?", (participant_id,)).fetchone()
            if not known:
                self._audit(AuditEvent("join", participant=participant_id))
            db.execute(
                "INSERT INTO participants (participant_id, joined_at, last_seen) VALUES (?, ?, ?) "
                "ON CONFLICT (participant_id) DO UPDATE SET last_seen=excluded.last_seen",
                (participant_id, now, now),
            )
        record = self.participant(participant_id)
        assert record is not None
        return record

    def participant(self, participant_id: str) -> ParticipantRecord | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM participants WHERE participant_id=?", (participant_id,)).fetchone()
        return participant_record(row) if row else None

    def participants(self) -> list[ParticipantRecord]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM participants ORDER BY participant_id").fetchall()
        return [participant_record(r) for r in rows]

    def last_policy_version(self, participant_id: str) -> int:
        """The highest policy version among the participant's journaled trajectories (0 if none).

        Read once per participant, then kept: the query reads every trajectory the participant
        ever had accepted, a cost that grew with the run at every submission. Only
        `record_submission` adds trajectories (a purge only flags them; the coordinator is the
        journal's one writer), and it raises the kept value after its COMMIT, so the value is
        always what the query would return (tests/unit/test_coordinator_speed.py)."""
        with self._lock:
            known = self._last_versions.get(participant_id)
            if known is not None:
                return known
            row = self._db.execute(
                "SELECT MAX(policy_version) FROM trajectories WHERE participant_id=?", (participant_id,)
            ).fetchone()
            version = int(row[0]) if row[0] is not None else 0
            self._last_versions[participant_id] = version
            return version

    def _raise_last_versions(self, accepted: Sequence[Any]) -> None:
        """After a COMMIT that added `accepted`: keep `last_policy_version` equal to its query."""
        for a in accepted:
            t = a.trajectory
            known = self._last_versions.get(t.source_id)  # the row's participant_id (trajectory_row)
            if known is not None and t.policy_version > known:
                self._last_versions[t.source_id] = int(t.policy_version)

    # -- submissions -----------------------------------------------------------------------------

    def record_submission(self, record: SubmissionRecord, result_for_seq: Callable[[int], str]) -> int:
        """Insert the whole submission in one transaction; return its sequence number after COMMIT.

        `result_for_seq(seq)` renders the result (with its receipt) stored for idempotent resends.
        """
        r = record
        with self._lock:  # held past the COMMIT until the kept versions are raised
            with self._tx() as db:
                cur = db.execute(
                    "INSERT INTO submissions (participant_id, round_id, content_hash, nonce, n_bytes, received_at, "
                    "result_json) VALUES (?, ?, ?, ?, ?, ?, '')",
                    (r.participant_id, r.round_id, r.content_hash, r.nonce, r.n_bytes, r.received_at),
                )
                seq = int(cur.lastrowid)
                refs, added = self._prompt_refs(db, r.accepted)
                db.executemany(
                    "INSERT INTO trajectories VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0)",
                    [trajectory_row(seq, r.round_id, a, refs[id(a.trajectory.prompt)]) for a in r.accepted],
                )
                db.executemany(
                    "INSERT INTO rejections (participant_id, round_id, submission_seq, trajectory_id, code, detail, "
                    "at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [
                        (r.participant_id, r.round_id, seq, x.trajectory_id, x.code.value, x.detail, r.received_at)
                        for x in r.rejections
                    ],
                )
                db.executemany(
                    "INSERT INTO strikes (participant_id, round_id, trajectory_id, code, at) VALUES (?, ?, ?, ?, ?)",
                    [(r.participant_id, r.round_id, x.trajectory_id, x.code.value, r.received_at) for x in r.strikes],
                )
                db.execute(
                    "UPDATE participants SET strikes=strikes+?, last_seen=? WHERE participant_id=?",
                    (len(r.strikes), r.received_at, r.participant_id),
                )
                if r.quarantine:
                    db.execute(
                        "UPDATE participants SET quarantined=1, quarantined_round=? WHERE participant_id=?",
                        (r.round_id, r.participant_id),
                    )
                    _event(db, r.received_at, "quarantine", r.participant_id, r.round_id,
                           f"{len(r.strikes)} new strike(s)")
                if r.report_json is not None:
                    db.execute("INSERT OR REPLACE INTO metrics VALUES (?, ?, ?)",
                               (r.participant_id, r.round_id, r.report_json))
                db.execute("UPDATE submissions SET result_json=? WHERE seq=?", (result_for_seq(seq), seq))
                codes = sorted({x.code.value for x in r.rejections})
                self._audit(AuditEvent(
                    "accept", r.participant_id, r.round_id, "OK",
                    f"seq {seq} content {r.content_hash[:16]}: accepted {len(r.accepted)}, rejected {len(r.rejections)}"
                    f"{' ' + ','.join(codes) if codes else ''}",
                ))
                if r.quarantine:
                    self._audit(AuditEvent("quarantine", r.participant_id, r.round_id, "HACFED-E-QUARANTINED",
                                           f"{len(r.strikes)} new strike(s)"))
                crash_point("before_commit")
            self._raise_last_versions(r.accepted)
            self._prompt_ids.update(added)  # only after the COMMIT: a rolled-back id is never reused
        return seq

    def _prompt_refs(self, db: sqlite3.Connection, accepted: Sequence[Any]) -> tuple[dict[int, int], dict[str, int]]:
        """The `prompts` id of each prompt object of `accepted` (by `id()`: the samples of a group
        share one, and all are alive during the insert), inserting new prompts in the open
        transaction; and the ids inserted or looked up here (kept by the caller after its COMMIT).
        One encoding per prompt object and at most one lookup per distinct prompt, none per row."""
        refs: dict[int, int] = {}
        added: dict[str, int] = {}
        for a in accepted:
            prompt = a.trajectory.prompt
            if id(prompt) in refs:
                continue
            text = prompt_json(prompt)
            ref = self._prompt_ids.get(text) or added.get(text)
            if ref is None:
                db.execute("INSERT OR IGNORE INTO prompts (prompt_json) VALUES (?)", (text,))
                ref = added[text] = int(db.execute("SELECT id FROM prompts WHERE prompt_json=?", (text,)).fetchone()[0])
            refs[id(prompt)] = ref
        return refs, added

    def record_rejection(self, participant_id: str | None, round_id: int | None, code: str, detail: str,
                         now: float) -> None:
        """A refusal before anything was recorded (wrong run, closed round, ...), kept for the audit."""
        with self._tx() as db:
            db.execute(
                "INSERT INTO rejections (participant_id, round_id, code, detail, at) VALUES (?, ?, ?, ?, ?)",
                (participant_id, round_id, code, detail, now),
            )
            self._audit(AuditEvent("reject", participant_id, round_id, code, detail))

    def record_report(self, participant_id: str, round_id: int, report_json: str) -> None:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO metrics VALUES (?, ?, ?)", (participant_id, round_id, report_json))
            self._audit(AuditEvent("final_report", participant_id, round_id))

    # -- queries (`JournalReads`) ------------------------------------------------------------------

    def count_strikes(self, participant_id: str, since_round: int) -> int:
        return self._reads.count_strikes(participant_id, since_round)

    def was_sent(self, participant_id: str, step: int) -> bool:
        return self._reads.was_sent(participant_id, step)

    def stored_result(self, content_hash: str) -> str | None:
        return self._reads.stored_result(content_hash)

    def hash_for_nonce(self, participant_id: str, nonce: str) -> str | None:
        return self._reads.hash_for_nonce(participant_id, nonce)

    def submission_seq(self, participant_id: str, round_id: int) -> int | None:
        return self._reads.submission_seq(participant_id, round_id)

    def used_trajectory_ids(self, participant_id: str, ids: Sequence[str]) -> set[str]:
        return self._reads.used_trajectory_ids(participant_id, ids)

    def accepted_rewards(self, round_id: int) -> list[tuple[str, float]]:
        return self._reads.accepted_rewards(round_id)

    def pool(self, round_id: int) -> tuple[Trajectory, ...]:
        return self._reads.pool(round_id)

    def round_sample_counts(self, round_id: int) -> tuple[int, int]:
        return self._reads.round_sample_counts(round_id)

    def submitters(self, round_id: int) -> dict[str, int]:
        return self._reads.submitters(round_id)

    def submitter_ids(self, round_id: int) -> set[str]:
        return self._reads.submitter_ids(round_id)

    def round_stats(self, round_id: int) -> dict[str, dict[str, Any]]:
        return self._reads.round_stats(round_id)

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        return self._reads.events(kind)

    def count(self, table: str) -> int:
        return self._reads.count(table)

    def pools_trained_on(self) -> dict[str, list[int]]:
        return self._reads.pools_trained_on()

    def rounds_with_samples_of(self, participant_id: str, from_round: int) -> list[int]:
        return self._reads.rounds_with_samples_of(participant_id, from_round)

    def samples_from(self, round_id: int) -> tuple[int | None, list[tuple[int, int, str, str, str, float]]]:
        return self._reads.samples_from(round_id)

    def successes_before(self, before: int | None, pick: Callable[[str, str, str], T | None], limit: int) -> list[T]:
        return self._reads.successes_before(before, pick, limit)

    # -- what each lab was sent (`sent_steps`) --------------------------------------------------------

    def sent_step(self, participant_id: str, step: int) -> SentStep | None:
        return self._reads.sent_step(participant_id, step)

    def sent_steps(self) -> list[SentStep]:
        return self._reads.sent_steps()

    def sent_steps_of(self, participant_id: str) -> list[int]:
        return self._reads.sent_steps_of(participant_id)

    def sent_to(self, step: int) -> set[str]:
        return self._reads.sent_to(step)

    def sent_pairs(self, participant_id: str) -> set[tuple[int, str]]:
        return self._reads.sent_pairs(participant_id)

    def record_sent_step(self, step: SentStep) -> None:
        """Journal one update's choice (`sent_steps` and its `sent_sources` rows) in one transaction; the key
        (participant, round, source) refuses a submission sent to the lab twice."""
        sources = step.sources
        with self._tx() as db:
            db.execute("INSERT INTO sent_steps VALUES (?, ?, ?, ?, ?)",
                       (step.participant_id, step.step, step.sent_at, step.capabilities_round, step.peers_per_prompt))
            rows = [(step.participant_id, step.step, q, s) for q in sorted(sources) for s in sorted(sources[q])]
            db.executemany("INSERT INTO sent_sources VALUES (?, ?, ?, ?)", rows)

    # -- purge (security.md "Nothing lost", R11) ------------------------------------------------------------

    def purge(self, participant_id: str, from_round: int, now: float, detail: str) -> dict[int, int]:
        """Withdraw the participant's accepted samples of rounds >= from_round from every pool
        published from now on, and quarantine it; returns {round: samples withdrawn} (empty when
        a previous purge already did it). One transaction, audited."""
        with self._tx() as db:
            withdrawn = {int(r): int(n) for r, n in db.execute(
                "SELECT round_id, COUNT(*) FROM trajectories WHERE participant_id=? AND round_id>=? AND purged=0 "
                "GROUP BY round_id ORDER BY round_id", (participant_id, from_round),
            )}
            db.execute("UPDATE trajectories SET purged=1 WHERE participant_id=? AND round_id>=?",
                       (participant_id, from_round))
            db.execute("UPDATE participants SET quarantined=1, quarantined_round=COALESCE(quarantined_round, ?) "
                       "WHERE participant_id=?", (from_round, participant_id))
            _event(db, now, "purge", participant_id, from_round, detail)
            self._audit(AuditEvent("purge", participant_id, from_round, "OK", detail))
        return withdrawn


def _event(db: sqlite3.Connection, at: float, kind: str, participant_id: str | None, round_id: int | None,
           detail: str) -> None:
    db.execute("INSERT INTO events (at, kind, participant_id, round_id, detail) VALUES (?, ?, ?, ?, ?)",
               (at, kind, participant_id, round_id, detail))

