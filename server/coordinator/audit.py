"""The coordinator's hash-chained audit log (security.md S10, T12).

Runs wherever the coordinator's journal is written (the ServerApp process, through
`hacfed.server.coordinator.Journal`) and in hacfed-server's administrative commands (`audit
verify`, `purge`, and the registration and revocation commands, which call `AuditLog.append`;
`hacfed.server.audit` re-exports this API).

    log = AuditLog(state_dir / "audit.log")
    log.append(AuditEvent("accept", participant="lab-a", round_id=3, code="OK", detail="accepted 12 of 12"))
    result = verify_audit_log(state_dir / "audit.log")   # result.ok, result.problem names the line

One JSON object per line: `id` (1, 2, ...), `prev` (the previous line's hash; 64 zeros for the
first), `at` (epoch seconds), `kind`, `participant`, `round`, `code`, `detail`, and `hash` =
sha256(b"hacfed/v1/audit" || 0x00 || the line's canonical JSON without `hash`). Editing any byte of
a line breaks its hash (or its JSON); deleting, inserting or reordering a line breaks the next id
and prev link, so `verify_audit_log` names the exact line.

Deleting lines at the END leaves a valid chain, and anyone can recompute it: so every append also
writes the head (line count and last hash) to `audit.log.head`, signed with the coordinator's
Ed25519 key (`coordinator.key` in the same state directory, the key that signs everything sent to
labs; made there by `hacfed.keys.ensure_key_pair` if it does not exist yet). Verify checks the
signature with `coordinator.pub` (or the copy the labs were given) and fails when the head is
missing, unsigned, signed by another key, ahead of the log (lines cut from the end) or behind it
(lines appended without the key). What this does not stop: whoever can read `coordinator.key` can
rewrite the log and sign a new head; and whoever saved an older head can cut the log back to it
(the head proves the log once reached that line, not that nothing followed; the labs' signed
receipts are the witness beyond it). The chain makes tampering evident; it does not make it
impossible.

Appends are durable before they return (write, fsync; the head is replaced atomically) and
serialized across processes with an exclusive `flock` on the log (verify takes a shared one), so
the command-line tools can append while the coordinator runs. A write that failed half-way (disk
full) leaves a torn last line; the next append cuts it off and says so in a `repair` line (its
decision was rolled back). A failed append raises `AuditError`: the journal writes the line inside
the same SQLite transaction as the decision it records, before COMMIT, so a decision whose line
cannot be written is rolled back and the coordinator fails closed (stops accepting).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from hacfed.envelope import load_public_key
from hacfed.keys import COORDINATOR_KEY_STEM, ensure_key_pair, fingerprint
from hacfed.server.coordinator.errors import AuditError, safe_text

AUDIT_DOMAIN = b"hacfed/v1/audit"
HEAD_DOMAIN = b"hacfed/v1/audit-head"  # never an envelope's domain: the coordinator key signs both
GENESIS = "0" * 64
HEAD_SUFFIX = ".head"
FIELDS = ("id", "prev", "at", "kind", "participant", "round", "code", "detail")
_TAIL_READ = 64 * 1024  # a line is far shorter than this (details are capped at 500 characters)


@dataclass(frozen=True)
class AuditEvent:
    """One audited fact. kind: accept | reject | join | register | revoke | quarantine | round_open |
    round_close | deadline_extended | final_report | purge (open-ended: new tools add kinds).
    code: "OK" for what was allowed, the HACFED-E-... code for what was refused, or a short word
    (a close reason, ...)."""

    kind: str
    participant: str | None = None
    round_id: int | None = None
    code: str = "OK"
    detail: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or not self.kind or not self.kind.replace("_", "").isalnum():
            raise ValueError(f"AuditEvent.kind must be a short word, got {self.kind!r}")
        if self.round_id is not None and (isinstance(self.round_id, bool) or not isinstance(self.round_id, int)):
            raise ValueError(f"AuditEvent.round_id must be an int or None, got {self.round_id!r}")


def line_hash(record: dict[str, Any]) -> str:
    body = json.dumps({k: record[k] for k in FIELDS}, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(AUDIT_DOMAIN + b"\x00" + body.encode("ascii")).hexdigest()


def head_message(lines: int, last_hash: str) -> bytes:
    """The exact bytes the head's signature covers."""
    body = json.dumps({"hash": last_hash, "lines": lines}, sort_keys=True, separators=(",", ":"))
    return HEAD_DOMAIN + b"\x00" + body.encode("ascii")


class AuditLog:
    """The log at `path`; its head is signed with `coordinator.key` in the same directory."""

    def __init__(self, path: str | os.PathLike, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self.head_path = self.path.with_name(self.path.name + HEAD_SUFFIX)
        self._clock = clock
        self._key: Ed25519PrivateKey | None = None

    def append(self, event: AuditEvent) -> dict[str, Any]:
        """Write one line durably and return it; raises AuditError when it cannot."""
        key = self._signing_key()  # before any byte: a line no head can cover is never written
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as exc:
            raise AuditError(f"audit log {self.path} cannot be opened: {exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            last_id, prev, torn = _last_line(fd, self.path)
            if torn:  # the previous append failed half-way: its decision was rolled back, drop the bytes
                os.ftruncate(fd, os.fstat(fd).st_size - torn)
                repair = AuditEvent("repair", code="TORN-LINE", detail=f"dropped {torn} bytes of a write that failed")
                last_id, prev = self._write(fd, repair, last_id, prev)
            last_id, prev = self._write(fd, event, last_id, prev)
            os.fsync(fd)
            _write_head(self.head_path, last_id, prev, key)
        except OSError as exc:
            raise AuditError(f"audit log {self.path} cannot be written: {exc}") from None
        finally:
            os.close(fd)  # also releases the lock
        return {"id": last_id, "hash": prev}

    def _signing_key(self) -> Ed25519PrivateKey:
        if self._key is None:
            try:
                self._key = ensure_key_pair(self.path.parent, COORDINATOR_KEY_STEM).load()
            except (OSError, ValueError, TypeError, UnsupportedAlgorithm) as exc:
                raise AuditError(f"audit log {self.path}: the coordinator key that signs its head cannot be "
                                 f"loaded: {exc}") from None
        return self._key

    def _write(self, fd: int, event: AuditEvent, last_id: int, prev: str) -> tuple[int, str]:
        record: dict[str, Any] = {
            "id": last_id + 1,
            "prev": prev,
            "at": round(float(self._clock()), 6),
            "kind": event.kind,
            "participant": None if event.participant is None else safe_text(event.participant, 128),
            "round": event.round_id,
            "code": safe_text(event.code, 64),
            "detail": safe_text(event.detail, 500),
        }
        record["hash"] = line_hash(record)
        data = (json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=True) + "\n").encode()
        written = os.write(fd, data)
        if written != len(data):  # a short write (file size limit, full disk) leaves a torn line
            raise OSError(f"short write: {written} of {len(data)} bytes")
        return record["id"], record["hash"]


def _last_line(fd: int, path: Path) -> tuple[int, str, int]:
    """(id, hash) of the last complete line, or (0, GENESIS) for an empty log, and the length of a
    torn line after it (bytes without a line end, left by a failed write)."""
    size = os.fstat(fd).st_size
    if size == 0:
        return 0, GENESIS, 0
    start = max(0, size - _TAIL_READ)
    tail = os.pread(fd, size - start, start)
    cut = tail.rfind(b"\n")
    if cut < 0:
        if start > 0:
            raise AuditError(f"audit log {path} ends with {len(tail)}+ bytes without a line end; run "
                             f"`hacfed-server audit verify`")
        return 0, GENESIS, len(tail)  # one torn first line
    torn = len(tail) - cut - 1
    lines = tail[:cut].split(b"\n")
    try:
        record = json.loads(lines[-1])
        return int(record["id"]), str(record["hash"]), torn
    except (ValueError, KeyError, TypeError):
        raise AuditError(f"audit log {path}: its last line is not an audit record; run `hacfed-server audit verify`")


def _write_head(path: Path, lines: int, last_hash: str, key: Ed25519PrivateKey) -> None:
    head = {"lines": lines, "hash": last_hash, "key": fingerprint(key.public_key()),
            "sig": key.sign(head_message(lines, last_hash)).hex()}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(head) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


@dataclass(frozen=True)
class VerifyResult:
    ok: bool
    lines: int  # complete lines that were checked
    problem: str | None = None  # names the first bad line
    line: int | None = None  # its 1-based number
    signer: str | None = None  # fingerprint of the key whose signature on the head verified


def verify_audit_log(path: str | os.PathLike, public_key: Ed25519PublicKey | None = None,
                     journal_tail: tuple[int, str] | None = None) -> VerifyResult:
    """Check every line's hash and link, then the tail the journal recorded, then the signed head;
    the first problem names its line.

    `public_key`: the coordinator's (default: `coordinator.pub` beside the log). `journal_tail`:
    (line number, hash) of the last line the journal recorded (`audit_tail.read_tail`): the log must
    still hold it, whatever the head file says."""
    path = Path(path)
    if not path.exists():
        return VerifyResult(False, 0, f"{path} does not exist")
    hashes: list[str] = []
    with open(path, "rb") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_SH)  # no append between reading the lines and the head
        for number, raw in enumerate(fh, start=1):
            problem = _check_line(raw, number, hashes[-1] if hashes else GENESIS)
            if problem is not None:
                return VerifyResult(False, number - 1, f"line {number}: {problem}", number)
            hashes.append(json.loads(raw)["hash"])
        head = _read_head(path.with_name(path.name + HEAD_SUFFIX), len(hashes))
    if journal_tail is not None and (problem := _check_tail(hashes, *journal_tail)) is not None:
        return problem
    if isinstance(head, VerifyResult):
        return head
    head_lines, head_hash, signature = head
    count = len(hashes)
    if public_key is None:
        pub_path = path.with_name(f"{COORDINATOR_KEY_STEM}.pub")
        try:
            public_key = load_public_key(pub_path)
        except (OSError, ValueError) as exc:
            return VerifyResult(False, count, f"the head's signature cannot be checked without the coordinator's "
                                              f"public key ({exc}); give the copy the labs hold")
    try:
        public_key.verify(signature, head_message(head_lines, head_hash))
    except InvalidSignature:
        return VerifyResult(False, count, f"the head does not carry the coordinator key's signature (key "
                                          f"{fingerprint(public_key)}): it was rewritten, or signed by another key")
    if head_lines > count:
        return VerifyResult(False, count, f"line {count + 1}: missing; {head_lines} lines were written, the log "
                                          f"ends after line {count} (lines deleted from the end)", count + 1)
    if (hashes[head_lines - 1] if head_lines else GENESIS) != head_hash:
        return VerifyResult(False, count, f"line {head_lines}: its hash differs from the signed head", head_lines)
    if head_lines < count:
        return VerifyResult(False, count, f"lines {head_lines + 1}-{count}: after the signed head (appended without "
                                          f"the coordinator's key, or the last append stopped before signing)",
                            head_lines + 1)
    return VerifyResult(True, count, signer=fingerprint(public_key))


def _check_tail(hashes: list[str], lines: int, last_hash: str) -> VerifyResult | None:
    """The failure when the log no longer holds the line the journal recorded last, with its hash."""
    count = len(hashes)
    if lines > count:
        return VerifyResult(False, count, f"line {count + 1}: missing; the journal recorded line {lines} in the "
                                          f"same transaction as its decision, the log ends after line {count} "
                                          f"(lines deleted from the end)", count + 1)
    if hashes[lines - 1] != last_hash:
        return VerifyResult(False, count, f"line {lines}: its hash differs from the one the journal recorded "
                                          f"(the log was rewritten)", lines)
    return None


def _read_head(path: Path, count: int) -> tuple[int, str, bytes] | VerifyResult:
    """(lines, last hash, signature) of the head file, or the failure that it is missing or malformed."""
    if not path.exists():
        return VerifyResult(False, count, f"{path.name} is missing: without the signed head, lines deleted from the "
                                          f"end cannot be detected")
    try:
        head = json.loads(path.read_text(encoding="utf-8"))
        lines, last_hash, signature = head["lines"], head["hash"], bytes.fromhex(head["sig"])
    except (ValueError, KeyError, TypeError, OSError) as exc:
        return VerifyResult(False, count, f"{path} is unreadable or unsigned: {exc!r}")
    if isinstance(lines, bool) or not isinstance(lines, int) or lines < 0 or not isinstance(last_hash, str):
        return VerifyResult(False, count, f"{path} is malformed")
    return lines, last_hash, signature


def _check_line(raw: bytes, number: int, prev: str) -> str | None:
    if not raw.endswith(b"\n"):
        return "torn (no line end): the write that produced it did not complete"
    try:
        record = json.loads(raw)
    except ValueError:
        return "not valid JSON (edited or corrupted)"
    if not isinstance(record, dict) or set(record) != {*FIELDS, "hash"}:
        return "not an audit record (fields missing or added)"
    if line_hash(record) != record["hash"]:
        return "content does not match its hash (edited)"
    if record["id"] != number:
        return (f"event id {record['id']!r} where {number} was expected: line {number} was deleted, or lines "
                f"were inserted or reordered")
    if record["prev"] != prev:
        return f"prev_hash does not match line {number - 1}'s hash (a line before it was changed or removed)"
    return None
