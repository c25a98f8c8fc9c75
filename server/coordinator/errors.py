"""The closed set of reasons the coordinator gives when it refuses something (security.md, "How a
refusal reaches a lab").

Runs in the coordinator's ServerApp process (the Flower ServerApp that hacfed-server's SuperLink
starts, through `hacfed.server.driver`) and, in-process, in `hacfed sim`.

Every rejection carries one `ErrorCode`; the transport sends its value (`HACFED-E-...`) as the
`hacfed-error-code` trailer and maps it to the gRPC status in `GRPC_STATUS` (names only, so this
module stays free of grpc). Codes never change meaning once released: add new ones instead.

Which round-related code applies:
  - ROUND_CLOSED: the round was the most recently closed one (a straggler's late submission, R4);
  - STALE_ROUND: an older closed round (a replayed old envelope, S3);
  - UNKNOWN_ROUND: a round that was never opened (a future round or garbage);
  - UNSENT_ROUND: an open round the journal does not show as sent to the lab (`sent_steps`, checked
    when the coordinator journals what it sends: the Flower driver under max_staleness >= 1).
An identical resend of a submission that was already recorded is none of these: it gets its
original result and receipt back (T4 idempotency), whatever the round's state now.
"""

from __future__ import annotations

import enum
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager


class ErrorCode(str, enum.Enum):
    # whole-submission gates (cheap, checked first)
    SCHEMA = "HACFED-E-SCHEMA"  # malformed field: wrong type, not finite, invalid text, bad report
    SIZE = "HACFED-E-SIZE"  # over max_submission_bytes / too many trajectories / response too long
    IDENTITY_MISMATCH = "HACFED-E-IDENTITY-MISMATCH"  # authenticated sender != Submission.participant_id
    WRONG_RUN = "HACFED-E-WRONG-RUN"
    UNKNOWN_PARTICIPANT = "HACFED-E-UNKNOWN-PARTICIPANT"  # never registered
    QUARANTINED = "HACFED-E-QUARANTINED"
    UNKNOWN_ROUND = "HACFED-E-UNKNOWN-ROUND"
    STALE_ROUND = "HACFED-E-STALE-ROUND"
    ROUND_CLOSED = "HACFED-E-ROUND-CLOSED"
    UNSENT_ROUND = "HACFED-E-UNSENT-ROUND"  # an open round whose plan the journal never sent to this lab
    NONCE_REUSE = "HACFED-E-NONCE-REUSE"  # same nonce, different payload
    DUPLICATE = "HACFED-E-DUPLICATE"  # second submission for a round, or a trajectory id already used
    # caps, checked before any costly work (decoding, hashing, verifying); each carries retry_after_s
    RATE_LIMITED = "HACFED-E-RATE-LIMITED"  # the participant's token bucket is empty
    QUOTA_BYTES = "HACFED-E-QUOTA-BYTES"  # more bytes this round than round_quota_bytes
    QUOTA_TRAJECTORIES = "HACFED-E-QUOTA-TRAJECTORIES"  # more trajectories this round than the quota
    AUDIT_UNAVAILABLE = "HACFED-E-AUDIT-UNAVAILABLE"  # the audit log cannot be written: fail closed (S10)
    # per trajectory / per group
    SOURCE_MISMATCH = "HACFED-E-SOURCE-MISMATCH"  # Trajectory.source_id != submitting participant
    UNKNOWN_PROMPT = "HACFED-E-UNKNOWN-PROMPT"  # not a prompt of the task at all
    UNASSIGNED_PROMPT = "HACFED-E-UNASSIGNED-PROMPT"  # a task prompt, but not in this round's plan
    PROMPT_MISMATCH = "HACFED-E-PROMPT-MISMATCH"  # prompt messages differ from the planned ones
    LOGPROB_RANGE = "HACFED-E-LOGPROB-RANGE"
    POLICY_VERSION = "HACFED-E-POLICY-VERSION"
    INCOMPLETE_GROUP = "HACFED-E-INCOMPLETE-GROUP"  # not exactly G samples for a planned prompt
    GROUP_REJECTED = "HACFED-E-GROUP-REJECTED"  # a valid sample whose group has an invalid sibling
    REWARD_MISMATCH = "HACFED-E-REWARD-MISMATCH"  # claimed reward != re-verified reward (a strike)
    # the whole submission, after judging began
    VERIFY_BUDGET = "HACFED-E-VERIFY-BUDGET"  # its verification took more than verify_budget_s (a strike)

    def __str__(self) -> str:
        return self.value


# gRPC status names (grpc.StatusCode member names) per code; never UNKNOWN or INTERNAL.
GRPC_STATUS: dict[ErrorCode, str] = {
    ErrorCode.SCHEMA: "INVALID_ARGUMENT",
    ErrorCode.SIZE: "RESOURCE_EXHAUSTED",
    ErrorCode.IDENTITY_MISMATCH: "PERMISSION_DENIED",
    ErrorCode.WRONG_RUN: "FAILED_PRECONDITION",
    ErrorCode.UNKNOWN_PARTICIPANT: "PERMISSION_DENIED",
    ErrorCode.QUARANTINED: "PERMISSION_DENIED",
    ErrorCode.UNKNOWN_ROUND: "FAILED_PRECONDITION",
    ErrorCode.STALE_ROUND: "FAILED_PRECONDITION",
    ErrorCode.ROUND_CLOSED: "FAILED_PRECONDITION",
    ErrorCode.UNSENT_ROUND: "FAILED_PRECONDITION",
    ErrorCode.NONCE_REUSE: "ALREADY_EXISTS",
    ErrorCode.DUPLICATE: "ALREADY_EXISTS",
    ErrorCode.RATE_LIMITED: "RESOURCE_EXHAUSTED",
    ErrorCode.QUOTA_BYTES: "RESOURCE_EXHAUSTED",
    ErrorCode.QUOTA_TRAJECTORIES: "RESOURCE_EXHAUSTED",
    ErrorCode.AUDIT_UNAVAILABLE: "UNAVAILABLE",
    ErrorCode.SOURCE_MISMATCH: "PERMISSION_DENIED",
    ErrorCode.UNKNOWN_PROMPT: "INVALID_ARGUMENT",
    ErrorCode.UNASSIGNED_PROMPT: "INVALID_ARGUMENT",
    ErrorCode.PROMPT_MISMATCH: "INVALID_ARGUMENT",
    ErrorCode.LOGPROB_RANGE: "OUT_OF_RANGE",
    ErrorCode.POLICY_VERSION: "INVALID_ARGUMENT",
    ErrorCode.INCOMPLETE_GROUP: "INVALID_ARGUMENT",
    ErrorCode.GROUP_REJECTED: "INVALID_ARGUMENT",
    ErrorCode.REWARD_MISMATCH: "INVALID_ARGUMENT",
    ErrorCode.VERIFY_BUDGET: "RESOURCE_EXHAUSTED",
}

# Codes that count as a strike against the sender: what proves dishonesty (a reward the shared
# deterministic verifier contradicts) or costs the coordinator far more than an honest submission
# does (answers whose verification outlasts the per-submission budget, many times what a full
# honest submission takes), never what an honest bug or a slow network causes.
STRIKE_CODES: frozenset[ErrorCode] = frozenset({ErrorCode.REWARD_MISMATCH, ErrorCode.VERIFY_BUDGET})


class CoordinatorStateError(RuntimeError):
    """The coordinator was driven out of order (e.g. closing a round that is not open): a bug in the
    caller (transport, CLI), not a participant's mistake."""


class JournalError(RuntimeError):
    """The journal cannot be used: wrong schema version, another run's journal, unsafe pragmas,
    a corrupt file or a read-only state directory."""


class AuditError(RuntimeError):
    """The audit log cannot be written (disk full, read-only, ...): the coordinator fails closed."""


class JournalWriteError(AuditError):
    """A journal write failed (disk full, file-size limit, I/O error): its transaction was rolled
    back and, as for a failed audit line, the coordinator fails closed (an `AuditError`, so every
    path that handles one handles this)."""


@contextmanager
def journal_writes(path: object) -> Iterator[None]:
    """Around a journal transaction: SQLite's OperationalError becomes a `JournalWriteError` in one line."""
    try:
        yield
    except sqlite3.OperationalError as exc:
        raise JournalWriteError(f"journal {path} cannot be written: {describe_db_error(exc)}") from None


def safe_text(value: object, limit: int = 200) -> str:
    """A printable, storable rendering of a peer-supplied value for details and logs.

    Peer strings may hold lone surrogates (unstorable in SQLite), control characters or megabytes;
    `repr` escapes the former, the limit bounds the latter.
    """
    text = repr(value) if not isinstance(value, str) else value.encode("utf-8", "backslashreplace").decode("utf-8")
    text = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text[: limit + 1])
    return text if len(text) <= limit else text[:limit] + "..."


def describe_db_error(exc: BaseException) -> str:
    """One line for an SQLite or file-system failure, with the likely cause."""
    text = str(exc)
    lowered = text.lower()
    if "not a database" in lowered or "malformed" in lowered:
        return f"{text} (the file is corrupt or not a hacfed journal; restore it from a backup or use a new state dir)"
    if "readonly" in lowered or "read-only" in lowered or isinstance(exc, PermissionError):
        return f"{text} (the state directory or the journal file is read-only; make it writable)"
    if "unable to open" in lowered:
        return f"{text} (its directory must exist and be writable)"
    if "disk" in lowered and "full" in lowered:
        return f"{text} (the disk is full)"
    return text
