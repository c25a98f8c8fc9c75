"""The journal's read-only queries: closing a round, publishing its pool, metrics, and purges.

Runs wherever the journal is open (the coordinator's ServerApp process, `hacfed sim`,
`hacfed-server purge`). Built by `hacfed.server.coordinator.journal.Journal`, which hands it its
connection and the lock that guards it; every query here takes the lock and writes nothing. The
journal's own methods of the same names call these: the journal's methods are its one API.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from operator import itemgetter
from typing import Any, Callable, Sequence, TypeVar

from hacfed.server.coordinator.journal_schema import SentStep
from hacfed.trajectory import ChatMessage, Trajectory

# The pool's sort key (participant_id, prompt_pos, idx: its ORDER BY), then the other columns a
# trajectory is built from (participant_id is the source).
_POOL_COLUMNS = (
    "t.participant_id, t.prompt_pos, t.idx, t.trajectory_id, t.prompt_id, t.policy_version, p.prompt_json, "
    "t.response_text, t.reward, t.source_logp_sum, t.source_token_count, t.finish_reason"
)
_POOL_ORDER = itemgetter(0, 1, 2)
T = TypeVar("T")


class JournalReads:
    """Read-only queries of the journal (see the module docstring)."""

    def __init__(self, db: sqlite3.Connection, lock: threading.RLock) -> None:
        self._db = db
        self._lock = lock

    # -- a submission's gates ---------------------------------------------------------------------

    def count_strikes(self, participant_id: str, since_round: int) -> int:
        with self._lock:
            row = self._db.execute(
                "SELECT COUNT(*) FROM strikes WHERE participant_id=? AND round_id>=?", (participant_id, since_round)
            ).fetchone()
        return int(row[0])

    def was_sent(self, participant_id: str, step: int) -> bool:
        """Whether an update for `step` (the round whose plan it rolls out) was journaled as sent to
        `participant_id` (`sent_steps`, written only when the engine journals each lab's steps:
        max_staleness >= 1 or round_join "newest")."""
        with self._lock:
            row = self._db.execute(
                "SELECT 1 FROM sent_steps WHERE participant_id=? AND step=?", (participant_id, step)
            ).fetchone()
        return row is not None

    def stored_result(self, content_hash: str) -> str | None:
        with self._lock:
            row = self._db.execute(
                "SELECT result_json FROM submissions WHERE content_hash=?", (content_hash,)
            ).fetchone()
        return row[0] if row else None

    def hash_for_nonce(self, participant_id: str, nonce: str) -> str | None:
        with self._lock:
            row = self._db.execute(
                "SELECT content_hash FROM submissions WHERE participant_id=? AND nonce=? AND nonce != ''",
                (participant_id, nonce),
            ).fetchone()
        return row[0] if row else None

    def submission_seq(self, participant_id: str, round_id: int) -> int | None:
        with self._lock:
            row = self._db.execute(
                "SELECT seq FROM submissions WHERE participant_id=? AND round_id=?", (participant_id, round_id)
            ).fetchone()
        return int(row[0]) if row else None

    def used_trajectory_ids(self, participant_id: str, ids: Sequence[str]) -> set[str]:
        """Which of `ids` this participant already used: ids live in their source's namespace, so
        another lab's ids never collide with them (journal schema v2)."""
        wanted = [i for i in ids if isinstance(i, str)]
        found: set[str] = set()
        with self._lock:
            for start in range(0, len(wanted), 500):  # stay under SQLite's bound-parameter limit
                chunk = wanted[start : start + 500]
                marks = ",".join("?" * len(chunk))
                rows = self._db.execute(
                    f"SELECT trajectory_id FROM trajectories WHERE participant_id=? AND trajectory_id IN ({marks})",
                    (participant_id, *chunk),
                )
                found.update(r[0] for r in rows)
        return found

    # -- closing a round, publishing its pool, metrics ---------------------------------------------

    def accepted_rewards(self, round_id: int) -> list[tuple[str, float]]:
        """(participant, verified reward) of each sample of `pool(round_id)`, in its order."""
        with self._lock:
            cur = self._db.cursor()
            cur.row_factory = None
            rows = cur.execute(
                "SELECT participant_id, prompt_pos, idx, reward FROM trajectories WHERE round_id=? AND purged=0",
                (round_id,),
            ).fetchall()
        rows.sort(key=_POOL_ORDER)  # as pool(): the same order as SQLite's ORDER BY of these keys
        return [(r[0], float(r[3])) for r in rows]

    def pool(self, round_id: int) -> tuple[Trajectory, ...]:
        """The accepted trajectories of a round, in a deterministic order (participant, prompt
        position, sample index), with verified rewards; samples withdrawn by a purge are left out.

        The same trajectories in the same order as the rows of the `trajectory_rows` view read one by
        one "... ORDER BY participant_id, prompt_pos, idx" (tests/unit/test_coordinator_speed.py),
        with less work per sample, since a pool holds a round's samples of every lab: rows come as
        plain tuples, each prompt is parsed once, and they are sorted here (a Python sort on the
        key, unique within a round, orders text as SQLite's BINARY collation does: UTF-8 byte order
        is code point order) instead of SQLite copying every row into a temporary B-tree."""
        with self._lock:
            cur = self._db.cursor()
            cur.row_factory = None
            rows = cur.execute(
                f"SELECT {_POOL_COLUMNS} FROM trajectories t JOIN prompts p ON p.id = t.prompt_ref "
                "WHERE t.round_id=? AND t.purged=0", (round_id,),
            ).fetchall()
        rows.sort(key=_POOL_ORDER)
        parsed: dict[str, tuple[ChatMessage, ...]] = {}  # a pool holds each prompt once
        out = []
        for source_id, _, _, tid, prompt_id, version, prompt_json, text, reward, lp, n, finish in rows:
            prompt = parsed.get(prompt_json)
            if prompt is None:
                prompt = parsed[prompt_json] = tuple(
                    ChatMessage(m["role"], m["content"]) for m in json.loads(prompt_json)
                )
            out.append(Trajectory(tid, prompt_id, source_id, version, prompt, text, reward, lp, n, finish))
        return tuple(out)

    def samples_from(self, round_id: int) -> tuple[int | None, list[tuple[int, int, str, str, str, float]]]:
        """Every accepted sample committed since the first one of a round >= `round_id`, purged or
        not, in the order they were committed, as (round, submission seq, participant, prompt id,
        response text, verified reward); and the first one's place in that order (its rowid: what
        `successes_before` reads before), None when there is none."""
        with self._lock:
            cur = self._db.cursor()
            cur.row_factory = None
            first = cur.execute("SELECT MIN(rowid) FROM trajectories WHERE round_id>=?", (round_id,)).fetchone()[0]
            if first is None:
                return None, []
            rows = cur.execute(
                "SELECT round_id, submission_seq, participant_id, prompt_id, response_text, reward FROM trajectories "
                "WHERE rowid>=? ORDER BY rowid", (first,),
            ).fetchall()
        return int(first), rows

    def successes_before(
        self, before: int | None, pick: Callable[[str, str, str], T | None], limit: int,
    ) -> list[T]:
        """`pick(participant, prompt id, response text)` of the newest `limit` accepted successes
        (verified reward > 0) committed before the sample at `before` (a rowid from `samples_from`;
        None: all), purged or not, for which it is not None, oldest first."""
        kept: list[T] = []
        with self._lock:
            cur = self._db.cursor()
            cur.row_factory = None
            cur.execute(
                "SELECT participant_id, prompt_id, response_text FROM trajectories WHERE rowid<? AND reward>0 "
                "ORDER BY rowid DESC", (before if before is not None else 2**63 - 1,),
            )
            while len(kept) < limit and (rows := cur.fetchmany(1024)):
                kept.extend(value for row in rows if (value := pick(*row)) is not None)
            cur.close()
        del kept[limit:]
        kept.reverse()
        return kept

    def round_sample_counts(self, round_id: int) -> tuple[int, int]:
        """(accepted samples of the round, how many of them a purge withdrew): whether a pool kept in
        memory still is the journal's (`KeptSamples.pool`)."""
        with self._lock:
            row = self._db.execute(
                "SELECT COUNT(*), COALESCE(SUM(purged), 0) FROM trajectories WHERE round_id=?", (round_id,),
            ).fetchone()
        return int(row[0]), int(row[1])

    def submitters(self, round_id: int) -> dict[str, int]:
        """participant -> number of accepted trajectories, for everyone with a recorded submission."""
        with self._lock:
            # Counted through the round index (a trajectory's round is its submission's): joining on
            # submission_seq alone made SQLite build a temporary index over every trajectory of the
            # run at each call, which grew with the journal (bench/coordinator_scale.py).
            rows = self._db.execute(
                "SELECT s.participant_id, COALESCE(SUM(c.n), 0) FROM submissions s LEFT JOIN "
                "(SELECT submission_seq, COUNT(*) AS n FROM trajectories WHERE round_id=? GROUP BY submission_seq) c "
                "ON c.submission_seq = s.seq WHERE s.round_id=? GROUP BY s.participant_id",
                (round_id, round_id),
            ).fetchall()
        return {r[0]: int(r[1]) for r in rows}

    def submitter_ids(self, round_id: int) -> set[str]:
        """Everyone with a recorded submission for the round: the keys of `submitters`, without
        counting the round's trajectories."""
        with self._lock:
            rows = self._db.execute("SELECT participant_id FROM submissions WHERE round_id=?", (round_id,)).fetchall()
        return {r[0] for r in rows}

    def round_stats(self, round_id: int) -> dict[str, dict[str, Any]]:
        """Per participant: accepted count, mean verified reward, rejection count, report."""
        stats: dict[str, dict[str, Any]] = {}
        with self._lock:
            for pid, n, mean in self._db.execute(
                "SELECT participant_id, COUNT(*), AVG(reward) FROM trajectories WHERE round_id=? "
                "GROUP BY participant_id",
                (round_id,),
            ):
                stats.setdefault(pid, {}).update(accepted=int(n), reward_mean=float(mean))
            for pid, n in self._db.execute(
                # refusals of whole submissions (late, duplicate, ...) stay in the audit rows but are
                # not the round's: a closed round's summary never changes after it closed
                "SELECT participant_id, COUNT(*) FROM rejections WHERE round_id=? AND submission_seq IS NOT NULL "
                "GROUP BY participant_id", (round_id,),
            ):
                stats.setdefault(pid, {})["rejected"] = int(n)
            reports = self._db.execute("SELECT participant_id, report_json FROM metrics WHERE round_id=?", (round_id,))
            for pid, report in reports:
                stats.setdefault(pid, {})["report"] = json.loads(report)
        return stats

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        query, args = "SELECT * FROM events", ()
        if kind is not None:
            query, args = query + " WHERE kind=?", (kind,)
        with self._lock:
            return [dict(r) for r in self._db.execute(query + " ORDER BY id", args)]

    def count(self, table: str) -> int:
        tables = ("rounds", "participants", "submissions", "trajectories", "rejections", "strikes", "metrics", "events",
                  "sent_steps", "sent_sources")
        if table not in tables:
            raise ValueError(f"unknown journal table {table!r}")
        with self._lock:
            return int(self._db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])

    # -- for a purge (hacfed-server purge) ----------------------------------------------------------

    def pools_trained_on(self) -> dict[str, list[int]]:
        """participant -> the rounds whose pools it reported training on: a submission for round
        k + 1 (or a final report for round k + 1) carries the report of training on pool k."""
        with self._lock:
            rows = self._db.execute(
                "SELECT participant_id, round_id FROM submissions UNION SELECT participant_id, round_id FROM metrics"
            ).fetchall()
        out: dict[str, set[int]] = {}
        for pid, round_id in rows:
            if round_id >= 1:
                out.setdefault(pid, set()).add(round_id - 1)
        return {pid: sorted(rounds) for pid, rounds in sorted(out.items())}

    def rounds_with_samples_of(self, participant_id: str, from_round: int) -> list[int]:
        """Rounds >= from_round in which the participant has accepted samples (purged or not)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT DISTINCT round_id FROM trajectories WHERE participant_id=? AND round_id>=? ORDER BY round_id",
                (participant_id, from_round),
            ).fetchall()
        return [int(r[0]) for r in rows]

    # -- what each lab was sent (`sent_steps`, `sent_sources`, `hacfed.server.coordinator.engine`) ----

    def sent_step(self, participant_id: str, step: int) -> SentStep | None:
        """The lab's journaled update of `step`, or None when none was built."""
        with self._lock:
            row = self._db.execute("SELECT sent_at, capabilities_round, peers_per_prompt FROM sent_steps "
                                   "WHERE participant_id=? AND step=?", (participant_id, step)).fetchone()
            if row is None:
                return None
            pairs = self._db.execute("SELECT round_id, source_id FROM sent_sources WHERE participant_id=? AND step=?",
                                     (participant_id, step)).fetchall()
        sources: dict[int, set[str]] = {}
        for q, source in pairs:
            sources.setdefault(int(q), set()).add(source)
        return SentStep(participant_id, step, float(row[0]), row[1], {q: frozenset(s) for q, s in sources.items()},
                        row[2])

    def sent_steps(self) -> list[SentStep]:
        """Every journaled update, by participant and step."""
        with self._lock:
            keys = self._db.execute("SELECT participant_id, step FROM sent_steps ORDER BY 1, 2").fetchall()
        return [s for pid, step in keys if (s := self.sent_step(pid, int(step))) is not None]

    def sent_steps_of(self, participant_id: str) -> list[int]:
        """The steps the lab was sent, in order."""
        with self._lock:
            rows = self._db.execute("SELECT step FROM sent_steps WHERE participant_id=? ORDER BY step",
                                    (participant_id,)).fetchall()
        return [int(r[0]) for r in rows]

    def sent_to(self, step: int) -> set[str]:
        """The labs that were sent `step` (under round_join "newest": the labs that took the round)."""
        with self._lock:
            rows = self._db.execute("SELECT participant_id FROM sent_steps WHERE step=?", (step,)).fetchall()
        return {r[0] for r in rows}

    def sent_pairs(self, participant_id: str) -> set[tuple[int, str]]:
        """The (round, source) submissions the lab was sent at any step."""
        with self._lock:
            rows = self._db.execute("SELECT round_id, source_id FROM sent_sources WHERE participant_id=?",
                                    (participant_id,)).fetchall()
        return {(int(q), s) for q, s in rows}
