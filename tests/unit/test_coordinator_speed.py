"""The coordinator's per-sample fast paths (bench/coordinator_scale.py) give exactly what the
contract demands: the content digest is the sha256 of the canonical wire bytes (pinned), decoded
trajectories share their prompts and are refused with the same codes and messages, the pool read
back from the journal is what its rows hold in SQLite's order, and the kept policy version is the
query's. Realistic submissions (every field as the decoder builds it) and hostile ones (odd types,
lone surrogates, non-finite numbers, enormous ints, objects that are not trajectories) go through.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hacfed import wire
from hacfed.messages import StepReport, Submission
from hacfed.proto import hacfed_v1_pb2 as pb
from hacfed.server.coordinator import validation
from hacfed.server.coordinator.validation import submission_digest
from hacfed.trajectory import ChatMessage, Trajectory
from hacfed.wire import convert
from hacfed.wire.types import MAX_PROMPT_MESSAGES, ErrorCode, WireError

PROMPT = (ChatMessage("system", "Answer in \\boxed{}."), ChatMessage("user", 'What is "12" + 34?\n'))
FIELDS = dict(
    trajectory_id="lab-a/1/p7/0", prompt_id="p7", source_id="lab-a", policy_version=1, prompt=PROMPT,
    response_text="12 + 34 = 46.\nSo \\boxed{46}.", reward=1.0, source_logp_sum=-12.5, source_token_count=20,
    finish_reason="stop",
)


# ---- strategies ---------------------------------------------------------------------------------

# Text with quotes, backslashes, control characters, DEL, non-ASCII, astral characters and lone
# surrogates.
texts = st.text(alphabet=st.one_of(
    st.sampled_from(['"', "\\", "\n", "\r", "\t", "\b", "\f", "\x00", "\x1f", "\x7f", "\u2028", "é", "\U0001f600",
                     "\ud800", "\udfff", "/", "a", " "]),
    st.characters(),
), max_size=40)
floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.0, 1.0, 1e-300, 5e-324]))
ints = st.one_of(st.integers(min_value=-(2**70), max_value=2**70), st.sampled_from([0, 1, 2**63, 2**64, -(2**64)]))
odd = st.one_of(st.none(), st.booleans(), ints, floats, texts, st.lists(st.integers(), max_size=2),
                st.builds(lambda: object()), st.builds(lambda: 10**5000))
messages = st.builds(ChatMessage, st.sampled_from(["system", "user", "assistant"]), texts)


class Str(str):
    """A str subclass, which no decoder builds."""


@st.composite
def trajectories(draw: Any) -> Any:
    """A valid Trajectory, usually; then, sometimes, one field forced to a hostile value behind
    the dataclass's back (what an in-process caller could hand `submit`)."""
    prompt = tuple(draw(st.lists(messages, min_size=1, max_size=3)))
    t = Trajectory(
        trajectory_id=draw(texts.filter(bool)), prompt_id=draw(texts.filter(bool)), source_id=draw(texts.filter(bool)),
        policy_version=draw(st.integers(min_value=0, max_value=2**64)), prompt=prompt, response_text=draw(texts),
        reward=draw(st.sampled_from([0.0, 1.0, 0.5, -0.0])), source_logp_sum=-draw(st.floats(0, 1e6)),
        source_token_count=draw(st.integers(min_value=1, max_value=2**64)),
        finish_reason=draw(st.sampled_from(["stop", "length"])),
    )
    kind = draw(st.sampled_from(["valid"] * 4 + ["field", "prompt", "message", "subclass", "other"]))
    if kind == "field":
        name = draw(st.sampled_from([f.name for f in dataclasses.fields(Trajectory)]))
        object.__setattr__(t, name, draw(odd))
    elif kind == "prompt":
        object.__setattr__(t, "prompt", draw(st.one_of(st.just(list(prompt)), st.just(prompt + ("raw",)), st.just(()))))
    elif kind == "message":
        m = prompt[0]
        object.__setattr__(m, draw(st.sampled_from(["role", "content"])), draw(st.one_of(odd, st.just(Str("user")))))
    elif kind == "subclass":
        object.__setattr__(t, draw(st.sampled_from(["trajectory_id", "response_text", "finish_reason"])), Str("stop"))
    elif kind == "other":
        return draw(st.one_of(odd, st.just(dataclasses.replace(t))))
    return t


@st.composite
def submissions(draw: Any) -> Submission:
    report: Any = draw(st.sampled_from([None, "valid", "hostile", "other"]))
    if report == "other":
        report = draw(odd)
    elif report is not None:
        hostile = report == "hostile"
        report = StepReport("lab-a", 0, {"loss": 0.25}, None)
        if hostile:  # forced behind the dataclass's back, as an in-process caller could
            object.__setattr__(report, "metrics", draw(st.dictionaries(st.one_of(texts, ints), odd, max_size=3)))
            object.__setattr__(report, "eval_accuracy", draw(odd))
    items = draw(st.lists(trajectories(), max_size=6))
    if items and draw(st.booleans()):  # a group's samples share one prompt tuple, as decoded ones do
        shared = next((t.prompt for t in items if type(t) is Trajectory), None)
        for t in items:
            if type(t) is Trajectory and shared is not None:
                object.__setattr__(t, "prompt", shared)
    sub = Submission("run", "lab-a", 1, (), report, nonce="ab" * 16, created_at_ms=draw(st.integers(0, 2**50)))
    object.__setattr__(sub, "trajectories", tuple(items))
    return sub


# ---- the content digest -------------------------------------------------------------------------


def _eight_samples() -> Submission:
    ts = tuple(Trajectory(**{**FIELDS, "trajectory_id": f"lab-a/1/p7/{i}", "reward": float(i % 2)})
               for i in range(8))
    return Submission("run", "lab-a", 1, ts, StepReport("lab-a", 0, {"loss": 0.25, "n": 3.0}, None), "cd" * 16, 17)


def test_the_digest_is_the_sha256_of_the_wire_bytes_the_lab_signed() -> None:
    sub = _eight_samples()
    ts = sub.trajectories
    body = wire.encode_submission(sub)
    decoded = wire.decode_submission(body)
    expected = (len(body), hashlib.sha256(body).hexdigest())
    # as received (the bytes hashed as they are), decoded without its bytes, and the lab's own object
    assert submission_digest(decoded, body) == submission_digest(decoded) == submission_digest(sub) == expected
    with_ids = dataclasses.replace(
        sub, trajectories=tuple(dataclasses.replace(t, response_token_ids=tuple(range(20))) for t in ts)
    )
    assert submission_digest(with_ids) == expected  # local-only token ids are not on the wire
    changed = dataclasses.replace(sub, trajectories=ts[:-1] + (dataclasses.replace(ts[-1], response_text="47"),))
    assert submission_digest(changed)[1] != expected[1]
    assert submission_digest(dataclasses.replace(sub, nonce="ef" * 16))[1] != expected[1]


def test_the_digest_of_a_fixed_submission_never_changes() -> None:
    """Journaled digests are how a resend is recognised across restarts and releases: the digest of
    this submission is pinned (a change of the wire encoding would turn identical resends into
    NONCE_REUSE refusals)."""
    assert submission_digest(_eight_samples()) == (
        1095, "471f1ba1dec91a4ccda19eca8b8038d836a6393e91b8098f098d924e0afb8b19")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(submissions())
def test_the_digest_of_any_submission_is_its_wire_digest_or_a_value_error(sub: Submission) -> None:
    """An in-process object the wire cannot encode is never digested some other way: it raises
    ValueError naming why (and the intake refuses it with SCHEMA)."""
    try:
        body = wire.encode_submission(sub)
    except (WireError, TypeError, ValueError, AttributeError, KeyError, OverflowError):
        with pytest.raises(ValueError, match="cannot be encoded for the wire"):
            submission_digest(sub)
    else:
        assert submission_digest(sub) == (len(body), hashlib.sha256(body).hexdigest())


# ---- decoding with shared prompts ---------------------------------------------------------------


def _submission(n: int = 8) -> Submission:
    other = (ChatMessage("user", "another question"),)
    ts = tuple(Trajectory(**{**FIELDS, "trajectory_id": f"t{i}", "prompt_id": f"p{i // 4}",
                             "prompt": PROMPT if i < 4 else other}) for i in range(n))
    return Submission("run", "lab-a", 1, ts, None, "ab" * 16, 5)


def _submission_frame(n: int = 8) -> pb.WireMessage:
    return pb.WireMessage.FromString(wire.encode_submission(_submission(n)))


def test_decoded_trajectories_share_equal_prompts_and_equal_what_was_sent() -> None:
    frame = _submission_frame()
    sub = wire.decode_submission(frame.SerializeToString(deterministic=True))
    assert sub.trajectories == _submission().trajectories
    assert len({id(t.prompt) for t in sub.trajectories}) == 2  # one tuple per distinct prompt
    assert convert._SHARED.table is None  # the table lives only while one message is read
    alone = wire.decode_trajectory(wire.encode_trajectory(sub.trajectories[0]))
    assert alone == sub.trajectories[0]
    batch = wire.decode_trajectory_batch(wire.encode_trajectory_batch(sub.trajectories))
    assert batch == sub.trajectories and len({id(t.prompt) for t in batch}) == 2


@pytest.mark.parametrize(("spoil", "code", "message"), [
    ("role", ErrorCode.SCHEMA, "ChatMessage.role: unknown or unset enum value 99"),
    ("late_role", ErrorCode.SCHEMA, "ChatMessage.role: unknown or unset enum value 0"),
    ("finish", ErrorCode.SCHEMA, "trajectory 't3' finish_reason: unknown or unset enum value 0"),
    ("logp", ErrorCode.LOGPROB_RANGE, "trajectory 't5': source_logp_sum must be finite and <= 0, got 1.0"),
    ("empty_id", ErrorCode.SCHEMA, "Trajectory.trajectory_id must be a non-empty string, got ''"),
    ("too_many_messages", ErrorCode.SIZE, "trajectory 't1' prompt holds 66 entries, more than the 64 allowed"),
    ("version_is_fine", None, ""),
])
def test_a_hostile_trajectory_is_refused_with_its_code(spoil: str, code: ErrorCode | None, message: str) -> None:
    frame = _submission_frame()
    ms = frame.submission.trajectories
    if spoil == "role":  # the first sample of a prompt carries an unknown role
        ms[0].prompt[1].role = 99
    elif spoil == "late_role":  # a later sample differs from the prompt already shared
        ms[6].prompt[0].role = 0
    elif spoil == "finish":
        ms[3].finish_reason = 0
    elif spoil == "logp":
        ms[5].source_logp_sum = 1.0
    elif spoil == "empty_id":
        ms[2].trajectory_id = ""
    elif spoil == "too_many_messages":
        for _ in range(MAX_PROMPT_MESSAGES):
            ms[1].prompt.add(role=pb.ROLE_USER, content="q")
    elif spoil == "version_is_fine":
        ms[7].policy_version = 2**63
    data = frame.SerializeToString(deterministic=True)
    if code is None:
        sub = wire.decode_submission(data)
        assert sub.trajectories[7] == dataclasses.replace(_submission().trajectories[7], policy_version=2**63)
    else:
        with pytest.raises(WireError) as raised:
            wire.decode_submission(data)
        assert raised.value.code == code and message in str(raised.value)
    assert convert._SHARED.table is None


# ---- cheap checks -------------------------------------------------------------------------------


@given(st.one_of(texts, st.just(Str("abc")), st.just(Str("\ud800"))))
def test_storable_text_is_text_without_lone_surrogates(text: str) -> None:
    assert validation.is_storable_text(text) == (not any("\ud800" <= c <= "\udfff" for c in text))


# ---- the journal: pool read-back and the quorum poll --------------------------------------------


def _journal_with_rounds(tmp_path: Path):
    from tests.unit.test_coordinator_fakes import make_coordinator, scripted_submission, scripted_trajectories

    coord = make_coordinator(tmp_path, rounds=2, expected_participants=3, min_participants=1, max_strikes=99)
    for pid in ("a", "b", "c"):
        coord.register(pid)
    for round_id in range(2):
        plan = coord.open_round(round_id)
        coord.submit(scripted_submission(plan, "b", falsify=1))
        coord.submit(scripted_submission(plan, "a"))
        lies = [dataclasses.replace(t, reward=1.0 - t.reward) for t in scripted_trajectories(plan, "c")]
        coord.submit(scripted_submission(plan, "c", trajectories=lies))
        coord.close_round("quorum")
    coord.journal.purge("b", 1, 0.0, "test")
    return coord


def test_the_pool_is_what_the_rows_hold(tmp_path: Path) -> None:
    from tests.unit.test_coordinator_fakes import trajectory_of_row

    coord = _journal_with_rounds(tmp_path)
    db = coord.journal._db
    for round_id in (0, 1, 5):
        rows = db.execute("SELECT * FROM trajectory_rows WHERE round_id=? AND purged=0 "
                          "ORDER BY participant_id, prompt_pos, idx", (round_id,)).fetchall()
        expected = tuple(trajectory_of_row(r) for r in rows)
        pool = coord.journal.pool(round_id)
        assert pool == expected and [t.__dict__ for t in pool] == [t.__dict__ for t in expected]
        assert [type(t.reward) for t in pool] == [type(t.reward) for t in expected]
    assert len(coord.journal.pool(0)) == 9 and {t.source_id for t in coord.journal.pool(1)} == {"a"}
    assert db.row_factory is sqlite3.Row  # the connection's other readers still get rows by name


def test_the_quorum_poll_reads_who_submitted_without_counting_samples(tmp_path: Path) -> None:
    from tests.unit.test_coordinator_fakes import FakeClock, make_coordinator, scripted_submission

    coord = _journal_with_rounds(tmp_path)
    for round_id in (0, 1, 2):
        assert coord.journal.submitter_ids(round_id) == set(coord.journal.submitters(round_id))
    clock = FakeClock()
    coord = make_coordinator(tmp_path / "poll", clock, expected_participants=2, min_participants=2)
    for pid in ("a", "b"):
        coord.register(pid)
    plan = coord.open_round(0)
    statements: list[str] = []
    coord.journal._db.set_trace_callback(statements.append)
    assert coord.ready_to_close() is None
    coord.submit(scripted_submission(plan, "a"))
    statements.clear()
    assert coord.ready_to_close() is None  # before the deadline, one of two: open
    assert not any("FROM trajectories" in s for s in statements), statements
    clock.t += 1000.0  # past the deadline with one contributor of the two needed
    assert coord.ready_to_close() is None and any("FROM trajectories" in s for s in statements)
    coord.journal._db.set_trace_callback(None)
    coord.submit(scripted_submission(plan, "b"))
    assert coord.ready_to_close() == "quorum"


SQLITE_POOL = "SELECT * FROM trajectory_rows WHERE round_id=? AND purged=0 ORDER BY participant_id, prompt_pos, idx"
SQLITE_REWARDS = ("SELECT participant_id, reward FROM trajectories WHERE round_id=? AND purged=0 "
               "ORDER BY participant_id, prompt_pos, idx")
storable = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=4)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(keys=st.lists(st.tuples(st.sampled_from(["a", "B", "b", "é", "ab", "a b", "\U0001f600", "\uffff", "z\x00"])
                               | storable, st.integers(0, 30), st.integers(0, 30)), unique=True, max_size=40),
       purged=st.sets(st.integers(0, 39)))
def test_the_pool_and_its_rewards_come_in_the_order_sqlite_sorted_them(tmp_path_factory, keys, purged) -> None:
    """Sorted in Python instead of by SQLite: the same order for any ids (UTF-8 byte order is code
    point order) and any positions, purged rows left out."""
    from hacfed.server.coordinator.journal import Journal
    from tests.unit.test_coordinator_fakes import trajectory_of_row

    journal = Journal(tmp_path_factory.mktemp("order") / "journal.sqlite")
    db = journal._db
    db.execute("PRAGMA foreign_keys=OFF")  # rows alone, without their submissions
    for q in range(3):
        db.execute("INSERT INTO prompts VALUES (?, ?)", (q + 1, json.dumps([{"role": "user", "content": f"q{q}"}])))
    for i, (pid, pos, idx) in enumerate(keys):
        db.execute("INSERT INTO trajectories VALUES (?, ?, ?, 3, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", (
            f"t{i}", i, pid, f"p{pos}", pos, idx, pos % 3 + 1,
            f"text {i}", float(i % 2), 0.0, -float(i), i + 1, "stop", i, int(i in purged)))
    expected = tuple(trajectory_of_row(r) for r in db.execute(SQLITE_POOL, (3,)).fetchall())
    assert journal.pool(3) == expected and [t.__dict__ for t in journal.pool(3)] == [t.__dict__ for t in expected]
    assert journal.accepted_rewards(3) == [(r[0], float(r[1])) for r in db.execute(SQLITE_REWARDS, (3,))]
    assert journal.pool(4) == () and journal.accepted_rewards(4) == []
    journal.close()


def test_the_kept_last_policy_version_is_always_what_the_query_returns(tmp_path: Path, monkeypatch) -> None:
    """Read once, raised after each COMMIT: equal to the MAX query after every submission,
    refused versions, a purge, a rolled-back insert and a fresh journal on the same file."""
    from hacfed.server.coordinator.journal import Journal
    from tests.unit.test_coordinator_fakes import make_coordinator, scripted_submission, scripted_trajectories

    coord = make_coordinator(tmp_path, rounds=3, expected_participants=2, min_participants=1, max_strikes=99)
    journal = coord.journal
    query = "SELECT MAX(policy_version) FROM trajectories WHERE participant_id=?"

    def fresh(pid: str) -> int:
        value = journal._db.execute(query, (pid,)).fetchone()[0]
        return 0 if value is None else int(value)

    for pid in ("a", "b"):
        coord.register(pid)
    assert journal.last_policy_version("a") == 0 and journal._last_versions == {"a": 0}
    versions = {0: {"a": 3, "b": 1}, 1: {"a": 2, "b": 5}, 2: {"a": 7, "b": 5}}  # a's 2 < 3 is refused
    for round_id in range(3):
        plan = coord.open_round(round_id)
        for pid in ("a", "b"):
            ts = scripted_trajectories(plan, pid, version=versions[round_id][pid])
            coord.submit(scripted_submission(plan, pid, trajectories=ts))
            assert journal.last_policy_version(pid) == fresh(pid), (round_id, pid)
        coord.close_round("quorum")
    assert (journal.last_policy_version("a"), journal.last_policy_version("b")) == (7, 5)
    journal.purge("a", 2, 0.0, "test")  # flags rows, keeps them: the query still counts them
    assert journal.last_policy_version("a") == fresh("a") == 7
    assert Journal(journal.path).last_policy_version("b") == 5

    import hacfed.server.coordinator.journal as journal_module
    from hacfed.server.coordinator.journal_schema import SubmissionRecord
    from hacfed.server.coordinator.validation import AcceptedTrajectory

    coord.register("c")
    assert journal.last_policy_version("c") == 0
    plan = coord.plan_for(2)
    late = [dataclasses.replace(t, policy_version=99) for t in scripted_trajectories(plan, "c")]
    record = SubmissionRecord("c", 2, "f" * 64, "", 1, 0.0,
                              tuple(AcceptedTrajectory(t, t.reward, i // 3, i % 3) for i, t in enumerate(late)),
                              (), (), False, None)

    def crash(name: str) -> None:
        if name == "before_commit":
            raise RuntimeError("crash before commit")

    monkeypatch.setattr(journal_module, "crash_point", crash)
    with pytest.raises(RuntimeError, match="crash before commit"):
        journal.record_submission(record, lambda seq: "{}")
    assert journal.last_policy_version("c") == fresh("c") == 0  # rolled back: not raised
    monkeypatch.setattr(journal_module, "crash_point", lambda name: None)
    journal.record_submission(record, lambda seq: "{}")
    assert journal.last_policy_version("c") == fresh("c") == 99
