"""The dashboard's snapshot of a federation, read from the coordinator's files without writing any.

    sources = DashboardSources(journal=STATE/journal.sqlite, metrics=STATE/metrics.jsonl, keys_dir=STATE/keys,
                               status=STATE/driver-status.json, run_id="demo", rounds=20, round_deadline_s=900.0)
    state = Snapshotter(sources).get()    # a JSON-ready dict, rebuilt at most once per sources.ttl_s

Why read-only and cached: the journal is the ServerApp's acknowledgement point (WAL, synchronous=FULL).
The dashboard opens it with a `mode=ro` URI and `PRAGMA query_only`, runs a handful of fixed
statements (no value from a request ever reaches SQL: the API takes no parameters) and closes it, so
it never holds a lock a round could wait for; one snapshot serves every poller until it is `ttl_s`
old. The metrics JSONL is read from where the previous snapshot stopped (complete lines only).
"""

from __future__ import annotations

import json
import math
import sqlite3
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable
from urllib.parse import quote

from hacfed.server.dashboard.learner import learner_view
from hacfed.server.dashboard.pace import NO_STALENESS, lab_paces, lab_staleness
from hacfed.server.reporting import MAX_STEP_TIME_S, StepTimes, split_round
from hacfed.truncation_warnings import TRUNCATION_WARN_FRAC, truncation_warning

TIME_PARTS = ("rollout", "training", "eval", "exchange", "coordinator")
MIN_CONNECTED_WINDOW_S = 120.0
BUDGET_SETTING = "[sampling] max_new_tokens"  # the coordinator's response budget, sent in every plan


@dataclass(frozen=True)
class DashboardSources:
    journal: Path
    metrics: Path
    keys_dir: Path
    status: Path
    run_id: str
    rounds: int
    round_deadline_s: float
    expected_participants: int = 0
    ttl_s: float = 1.0


# -- the journal, read-only -------------------------------------------------------------------------


def open_read_only(path: Path) -> sqlite3.Connection:
    """A connection that cannot write: `mode=ro` URI plus query_only; short busy timeout."""
    db = sqlite3.connect(f"file:{quote(str(Path(path).resolve()))}?mode=ro", uri=True, timeout=0.5,
                         check_same_thread=False)
    db.row_factory = sqlite3.Row
    db.execute("PRAGMA query_only=ON")
    return db


def read_journal(path: Path) -> dict[str, Any]:
    """The rows the page shows; an absent journal (the server has not created it yet) reads empty."""
    empty: dict[str, Any] = {"rounds": [], "participants": [], "accepted": {}, "rejections": [], "submitted": [],
                             "submissions": [], "sent": []}
    if not Path(path).exists():
        return empty
    db = open_read_only(path)
    try:
        has = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "rounds" not in has:
            return empty
        rounds = [dict(r) for r in db.execute(
            "SELECT round_id, state, opened_at, deadline, extensions, closed_at, close_reason, below_quorum "
            "FROM rounds ORDER BY round_id")]
        participants = [dict(r) for r in db.execute(
            "SELECT participant_id, joined_at, last_seen, strikes, quarantined, quarantined_round "
            "FROM participants ORDER BY participant_id")]
        accepted = {r[0]: int(r[1]) for r in db.execute(
            "SELECT participant_id, COUNT(*) FROM trajectories GROUP BY participant_id")}
        rejections = [dict(r) for r in db.execute(
            "SELECT participant_id, code, COUNT(*) AS n FROM rejections GROUP BY participant_id, code "
            "ORDER BY participant_id, code")]
        latest = rounds[-1]["round_id"] if rounds else None
        submitted = [] if latest is None else [r[0] for r in db.execute(
            "SELECT participant_id FROM submissions WHERE round_id=? ORDER BY participant_id", (latest,))]
        submissions = [dict(r) for r in db.execute(  # each lab's replies: its round and idle time (pace.py)
            "SELECT participant_id, round_id, received_at FROM submissions ORDER BY participant_id, round_id")]
        sent = [] if "sent_sources" not in has else [dict(r) for r in db.execute(  # K >= 1, schema >= 4 (pace.py)
            "SELECT participant_id, step, round_id FROM sent_sources s WHERE step = (SELECT MAX(step) "
            "FROM sent_sources WHERE participant_id = s.participant_id) ORDER BY participant_id, round_id")]
        return {"rounds": rounds, "participants": participants, "accepted": accepted, "rejections": rejections,
                "submitted": submitted, "submissions": submissions, "sent": sent}
    finally:
        db.close()


# -- the metrics file, incrementally ----------------------------------------------------------------


@dataclass
class MetricsTail:
    """The metrics rows so far; each call reads only what was appended (a shorter file: start over)."""

    path: Path
    rows: list[dict[str, Any]] = field(default_factory=list)
    offset: int = 0

    def read(self) -> list[dict[str, Any]]:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            self.rows, self.offset = [], 0
            return self.rows
        if size < self.offset:
            self.rows, self.offset = [], 0
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            data = fh.read(size - self.offset)
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        for line in complete.decode("utf-8", errors="replace").splitlines():
            try:
                row = json.loads(line, parse_constant=_not_json)
            except ValueError:
                continue  # a torn line (the driver writes the round again), or NaN/Infinity: not JSON
            if isinstance(row, dict) and isinstance(row.get("round"), int) and isinstance(row.get("agent"), str):
                self.rows.append(row)
        return self.rows


# -- pure: rows -> what the page draws --------------------------------------------------------------


def _not_json(constant: str) -> None:
    """`NaN` and `Infinity` are not JSON, and the page's own JSON could not carry them."""
    raise ValueError(f"{constant} in a metrics row")


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _seconds(value: Any) -> float | None:
    """A time of the split, or None outside [0, MAX_STEP_TIME_S] (huge times would sum to infinity)."""
    seconds = _num(value)
    return seconds if seconds is not None and 0.0 <= seconds <= MAX_STEP_TIME_S else None


def curves(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-lab reward, P̂ and held-out accuracy by round, aligned on one x axis for the charts
    (uPlot draws `null` as a gap). The last row of a (round, agent) wins: a resumed driver may repeat it."""
    by_key: dict[tuple[int, str], dict[str, Any]] = {}
    for row in rows:
        by_key[(row["round"], row["agent"])] = row
    rounds = sorted({r for r, _ in by_key})
    labs = sorted({a for _, a in by_key})
    out: dict[str, Any] = {"rounds": rounds, "labs": labs, "reward": {}, "capability": {}, "eval_accuracy": {}}
    for metric, key in (("reward", "reward_mean"), ("capability", "capability"), ("eval_accuracy", "eval_accuracy")):
        for lab in labs:
            out[metric][lab] = [_num(by_key.get((r, lab), {}).get(key)) for r in rounds]
    return out


def time_split(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Each closed round's wall time as rollout + training + eval + exchange + coordinator, recomputed
    from the rows with the driver's own `split_round` (the slowest lab's step)."""
    per_round: dict[int, dict[str, Any]] = {}
    for row in rows:
        if row.get("final") or _seconds(row.get("time_round_s")) is None:
            continue
        entry = per_round.setdefault(row["round"], {"wall": row["time_round_s"],
                                                    "coordinator": _seconds(row.get("time_coordinator_s")) or 0.0,
                                                    "steps": {}})
        parts = [_seconds(row.get(f"time_{p}_s")) for p in ("rollout", "training", "eval", "exchange")]
        if all(p is not None for p in parts):
            rollout, training, evaluation, exchange = parts
            entry["steps"][row["agent"]] = StepTimes(rollout, training, evaluation, 0.0,
                                                     rollout + training + evaluation + exchange)
    out: dict[str, Any] = {"rounds": sorted(per_round), "wall": [], "slowest": []}
    for part in TIME_PARTS:
        out[part] = []
    for r in out["rounds"]:
        e = per_round[r]
        t = split_round(float(e["wall"]), float(e["coordinator"]), e["steps"])
        out["wall"].append(t.wall_s)
        out["slowest"].append(t.slowest)
        for part in TIME_PARTS:
            out[part].append(getattr(t, f"{part}_s"))
    return out


def connected_window(wall_times: list[float]) -> float:
    """A lab is shown connected when the coordinator heard from it (join or submission) within this
    many seconds: two median rounds, at least two minutes."""
    return max(MIN_CONNECTED_WINDOW_S, 2 * statistics.median(wall_times)) if wall_times else MIN_CONNECTED_WINDOW_S


def participants_table(journal: dict[str, Any], fingerprints: dict[str, str], rows: list[dict[str, Any]],
                       now: float, window_s: float, total_rounds: int = 0) -> list[dict[str, Any]]:
    rejected: dict[str, int] = {}
    for r in journal["rejections"]:
        if r["participant_id"] is not None:
            rejected[r["participant_id"]] = rejected.get(r["participant_id"], 0) + int(r["n"])
    latest: dict[str, dict[str, Any]] = {}
    for row in rows:
        if not row.get("final"):
            latest[row["agent"]] = row
    seen = {p["participant_id"]: p for p in journal["participants"]}
    paces = lab_paces(journal["submissions"], journal["rounds"], total_rounds, now)
    staleness = lab_staleness(journal.get("sent", []))
    no_pace = {"last_round": None, "behind": None, "idle_last_s": None, "idle_s": None, "idle_share": None,
               "waiting_s": None}
    table = []
    for pid in sorted(set(seen) | set(fingerprints)):
        p = seen.get(pid)
        last = latest.get(pid, {})
        cut = _num(last.get("train/rollout_truncated_frac"))  # responses cut at the budget
        table.append({
            "id": pid,
            "fingerprint": fingerprints.get(pid),
            "registered": pid in fingerprints,
            "joined": p is not None,
            "connected": p is not None and now - float(p["last_seen"]) <= window_s,
            "last_seen_s": None if p is None else max(now - float(p["last_seen"]), 0.0),
            "strikes": 0 if p is None else int(p["strikes"]),
            "quarantined": bool(p and p["quarantined"]),
            "quarantined_round": None if p is None else p["quarantined_round"],
            "submitted_this_round": pid in journal["submitted"],
            "accepted": journal["accepted"].get(pid, 0),
            "rejected": rejected.get(pid, 0),
            "reward": _num(last.get("reward_mean")),
            "truncated": cut,
            "truncation_warning": truncation_warning(pid, cut, BUDGET_SETTING)  # what hacfed-client says
            if cut is not None and cut > TRUNCATION_WARN_FRAC else None,
            "capability": _num(last.get("capability")),
            **learner_view(last),
            **paces.get(pid, no_pace),
            **staleness.get(pid, NO_STALENESS),
        })
    return table


def round_progress(journal: dict[str, Any], sources: DashboardSources, status: dict[str, Any],
                   now: float) -> dict[str, Any]:
    rounds = journal["rounds"]
    closed = sum(1 for r in rounds if r["state"] != "OPEN")
    out: dict[str, Any] = {"total": sources.rounds, "closed": closed, "done": bool(status.get("done")),
                           "current": None}
    if rounds:
        r = rounds[-1]
        opened, deadline = float(r["opened_at"]), float(r["deadline"])
        end = float(r["closed_at"]) if r["closed_at"] is not None else now
        out["current"] = {
            "id": r["round_id"], "state": r["state"], "elapsed_s": max(end - opened, 0.0),
            "deadline_s": max(deadline - opened, 0.0),
            "remaining_s": max(deadline - now, 0.0) if r["state"] == "OPEN" else 0.0,
            "extensions": int(r["extensions"]), "close_reason": r["close_reason"],
            "submitted": sorted(journal["submitted"]), "expected": sources.expected_participants,
        }
    return out


def counts(journal: dict[str, Any]) -> dict[str, Any]:
    codes: dict[str, int] = {}
    for r in journal["rejections"]:
        codes[r["code"]] = codes.get(r["code"], 0) + int(r["n"])
    return {"accepted": sum(journal["accepted"].values()), "rejected": sum(codes.values()),
            "codes": dict(sorted(codes.items())),
            "by_lab": [{"id": r["participant_id"], "code": r["code"], "n": int(r["n"])} for r in journal["rejections"]]}


def build_state(sources: DashboardSources, journal: dict[str, Any], rows: list[dict[str, Any]],
                fingerprints: dict[str, str], status: dict[str, Any], now: float) -> dict[str, Any]:
    """The whole /api/state document (pure)."""
    split = time_split(rows)
    return {
        "run_id": sources.run_id, "now": now,
        "round": round_progress(journal, sources, status, now),
        "participants": participants_table(journal, fingerprints, rows, now, connected_window(split["wall"]),
                                           sources.rounds),
        "curves": curves(rows), "times": split, "counts": counts(journal),
    }


# -- the cached snapshot ----------------------------------------------------------------------------


def registry_fingerprints(keys_dir: Path) -> dict[str, str]:
    from hacfed.keys import fingerprint
    from hacfed.server.registry import load_registry

    return {pid: fingerprint(e.signing_key) for pid, e in load_registry(keys_dir).entries.items()}


def read_status(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


class Snapshotter:
    """Builds the state at most once per `ttl_s`; concurrent pollers share it. A read that fails
    (the journal busy, a file mid-rename) keeps the previous snapshot and reports the error."""

    def __init__(self, sources: DashboardSources, clock: Callable[[], float] = time.time) -> None:
        self.sources, self.clock = sources, clock
        self._lock = threading.Lock()
        self._tail = MetricsTail(Path(sources.metrics))
        self._state: dict[str, Any] | None = None
        self._built_at = float("-inf")
        self._keys_signature: tuple | None = None
        self._fingerprints: dict[str, str] = {}
        self.builds = 0

    def _fingerprints_now(self) -> dict[str, str]:
        from hacfed.server.registry import signature

        sig = signature(self.sources.keys_dir)
        if sig != self._keys_signature:
            self._fingerprints, self._keys_signature = registry_fingerprints(self.sources.keys_dir), sig
        return self._fingerprints

    def get(self) -> dict[str, Any]:
        with self._lock:
            now = self.clock()
            if self._state is not None and now - self._built_at < self.sources.ttl_s:
                return self._state
            try:
                journal = read_journal(self.sources.journal)
                state = build_state(self.sources, journal, self._tail.read(), self._fingerprints_now(),
                                    read_status(self.sources.status), now)
                state["error"] = None
            except (sqlite3.Error, OSError) as exc:
                state = dict(self._state or {"run_id": self.sources.run_id, "now": now})
                state["error"] = f"could not read the coordinator's files: {exc}"
            self._state, self._built_at = state, now
            self.builds += 1
            return state
