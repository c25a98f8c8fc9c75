"""S10: the hash-chained audit log. Every accept and reject writes one line inside its journal
transaction; `hacfed-server audit verify` names the exact line of a one-byte edit or a deleted line;
a failed audit write (disk full, file size limit) makes the coordinator fail closed."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hacfed.server.audit import AuditEvent, AuditLog, verify_audit_log
from hacfed.server.coordinator import Coordinator, ErrorCode, Journal
from hacfed.server.main import main as server_main
from tests.unit.test_coordinator_fakes import TASK, FakeClock, make_config, scripted_submission

REPO = Path(__file__).resolve().parents[2]


def _log_with(tmp_path: Path, n: int) -> Path:
    log = AuditLog(tmp_path / "audit.log", clock=lambda: 1000.0)
    for i in range(n):
        log.append(AuditEvent("accept" if i % 2 else "reject", participant=f"lab-{i % 3}", round_id=i // 3,
                              code="OK" if i % 2 else "HACFED-E-SCHEMA", detail=f"event {i}"))
    return log.path


def _audited_coordinator(tmp_path: Path, clock: FakeClock | None = None) -> Coordinator:
    cfg = make_config(tmp_path)
    journal = Journal(cfg.journal_path, audit=AuditLog(cfg.audit_path, clock=clock or FakeClock()))
    return Coordinator(cfg, TASK, journal, clock=clock or FakeClock())


def test_lines_chain_and_verify(tmp_path):
    path = _log_with(tmp_path, 5)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [x["id"] for x in lines] == [1, 2, 3, 4, 5] and lines[0]["prev"] == "0" * 64
    assert all(b["prev"] == a["hash"] for a, b in zip(lines, lines[1:]))
    assert set(lines[0]) == {"id", "prev", "at", "kind", "participant", "round", "code", "detail", "hash"}
    assert verify_audit_log(path).ok and verify_audit_log(path).lines == 5


def test_every_single_byte_edit_is_found_at_its_line(tmp_path):
    path = _log_with(tmp_path, 4)
    original = path.read_bytes()
    starts = [0] + [i + 1 for i, b in enumerate(original) if b == ord("\n")][:-1]
    for offset in range(len(original)):
        if original[offset] == ord("\n"):
            continue
        line = sum(1 for s in starts if s <= offset)
        data = bytearray(original)
        data[offset] = ord("x") if data[offset] != ord("x") else ord("y")
        path.write_bytes(bytes(data))
        result = verify_audit_log(path)
        assert not result.ok and result.line == line, (offset, result)
    path.write_bytes(original)
    assert verify_audit_log(path).ok


@pytest.mark.parametrize("deleted", [1, 3, 5])
def test_a_deleted_line_is_named(tmp_path, deleted):
    path = _log_with(tmp_path, 5)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[: deleted - 1] + lines[deleted:]))
    result = verify_audit_log(path)
    assert not result.ok and result.line == deleted, result
    assert f"line {deleted}" in result.problem


def test_cli_verify_names_the_line_and_exits_nonzero(tmp_path, capsys):
    path = _log_with(tmp_path, 3)
    assert server_main(["audit", "verify", "--state-dir", str(tmp_path)]) == 0
    assert "3 lines, hash chain intact" in capsys.readouterr().out
    text = path.read_text().replace("event 1", "event 7")  # one byte, in line 2
    path.write_text(text)
    assert server_main(["audit", "verify", "--state-dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "FAILED verification: line 2: content does not match its hash (edited)" in out


def test_every_accept_and_reject_writes_one_line(tmp_path):
    coord = _audited_coordinator(tmp_path)
    coord.register("a")
    plan = coord.open_round(0)
    assert coord.submit(scripted_submission(plan, "a")).recorded
    assert coord.submit(scripted_submission(plan, "b")).refusal == ErrorCode.UNKNOWN_PARTICIPANT
    assert coord.submit(scripted_submission(plan, "a", nonce="1" * 32)).refusal == ErrorCode.DUPLICATE
    coord.close_round("quorum")
    records = map(json.loads, coord.cfg.audit_path.read_text().splitlines())
    kinds = [(r["kind"], r["participant"], r["code"]) for r in records]
    assert kinds == [("join", "a", "OK"), ("round_open", None, "OK"), ("accept", "a", "OK"),
                     ("reject", "b", "HACFED-E-UNKNOWN-PARTICIPANT"), ("reject", "a", "HACFED-E-DUPLICATE"),
                     ("round_close", None, "quorum")]
    assert verify_audit_log(coord.cfg.audit_path).ok


def test_audit_write_failure_fails_closed(tmp_path, monkeypatch):
    coord = _audited_coordinator(tmp_path)
    coord.register("a")
    coord.register("b")
    plan = coord.open_round(0)
    real_write = os.write

    def disk_full(fd, data):
        if os.fstat(fd).st_ino == os.stat(coord.cfg.audit_path).st_ino:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr("hacfed.server.coordinator.audit.os.write", disk_full)
    result = coord.submit(scripted_submission(plan, "a"))
    assert result.refusal == ErrorCode.AUDIT_UNAVAILABLE and "No space left" in result.rejected[0].detail
    assert coord.journal.count("submissions") == 0  # the decision was rolled back with its line
    assert coord.failed_closed
    monkeypatch.undo()  # even once the disk has room again, this coordinator accepts nothing until restarted
    assert coord.submit(scripted_submission(plan, "b")).refusal == ErrorCode.AUDIT_UNAVAILABLE
    assert coord.admit("b", 100).code == ErrorCode.AUDIT_UNAVAILABLE
    assert coord.journal.count("submissions") == 0 and coord.journal.count("rejections") == 0
    assert verify_audit_log(coord.cfg.audit_path).ok  # nothing torn
    restarted = _audited_coordinator(tmp_path)
    assert restarted.submit(scripted_submission(plan, "b")).recorded


def test_file_size_limit_becomes_an_audit_error(tmp_path):
    """A real write failure: RLIMIT_FSIZE just above the log's size (in a child process, so the
    limit touches nothing else), as on a full disk."""
    path = _log_with(tmp_path, 2)
    code = textwrap.dedent(f"""
        import os, resource, sys
        from hacfed.server.audit import AuditError, AuditEvent, AuditLog
        size = os.path.getsize({str(path)!r})
        resource.setrlimit(resource.RLIMIT_FSIZE, (size + 40, resource.RLIM_INFINITY))
        try:
            AuditLog({str(path)!r}).append(AuditEvent("accept", participant="lab-a", round_id=1, detail="x" * 200))
        except AuditError as exc:
            print("AuditError:", exc)
            sys.exit(3)
        sys.exit(0)
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=False)
    assert result.returncode == 3, result.stderr
    assert "cannot be written" in result.stdout
    check = verify_audit_log(path)
    assert not check.ok and check.line == 3 and "torn" in check.problem  # the partial line is evident
    AuditLog(path).append(AuditEvent("accept"))  # once there is room: the torn bytes are cut, and said so
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [(x["id"], x["kind"]) for x in lines] == [(1, "reject"), (2, "accept"), (3, "repair"), (4, "accept")]
    assert verify_audit_log(path).ok


def test_the_head_catches_lines_deleted_from_the_end(tmp_path):
    path = _log_with(tmp_path, 4)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:3]))
    result = verify_audit_log(path)
    assert not result.ok and result.line == 4 and "deleted from the end" in result.problem


def test_strikes_and_quarantine_are_audited(tmp_path):
    """S6: K=3 strikes quarantine a participant, and the quarantine is an audit line of its own."""
    clock = FakeClock()
    coord = _audited_coordinator(tmp_path, clock)
    coord.register("cheat")
    plan = coord.open_round(0)
    result = coord.submit(scripted_submission(plan, "cheat", falsify=3))  # 3 falsified rewards in one submission
    assert not result.accepted_ids and coord.journal.participant("cheat").quarantined
    lines = [json.loads(x) for x in coord.cfg.audit_path.read_text().splitlines()]
    accept, quarantine = lines[-2], lines[-1]
    assert accept["kind"] == "accept" and "HACFED-E-REWARD-MISMATCH" in accept["detail"]
    assert (quarantine["kind"], quarantine["participant"], quarantine["code"]) == ("quarantine", "cheat",
                                                                                  "HACFED-E-QUARANTINED")
    assert coord.submit(scripted_submission(plan, "cheat", nonce="2" * 32)).refusal == ErrorCode.QUARANTINED
    assert json.loads(coord.cfg.audit_path.read_text().splitlines()[-1])["code"] == "HACFED-E-QUARANTINED"


def _forge_line(path: Path, detail: str) -> None:
    """Append a line with a valid chain link and hash: anyone can compute those, no key needed."""
    from hacfed.server.coordinator.audit import line_hash

    last = json.loads(path.read_text().splitlines()[-1])
    record = {"id": last["id"] + 1, "prev": last["hash"], "at": 1000.0, "kind": "accept", "participant": "lab-x",
              "round": 0, "code": "OK", "detail": detail}
    record["hash"] = line_hash(record)
    with open(path, "a") as fh:
        fh.write(json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n")


def test_lines_cut_from_the_end_with_the_head_deleted_are_a_failure(tmp_path, capsys):
    path = _log_with(tmp_path, 4)
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:2]))
    path.with_name("audit.log.head").unlink()
    result = verify_audit_log(path)
    assert not result.ok and "audit.log.head is missing" in result.problem
    assert server_main(["audit", "verify", "--state-dir", str(tmp_path)]) == 1
    assert "FAILED verification" in capsys.readouterr().out


def test_a_head_rewritten_without_the_key_is_a_failure(tmp_path):
    """Cut the log, then write the head it would have: unsigned, with the old signature, or signed
    by a key of the attacker's own."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from hacfed.server.coordinator.audit import head_message

    path = _log_with(tmp_path, 4)
    head_path = path.with_name("audit.log.head")
    old = json.loads(head_path.read_text())
    lines = path.read_text().splitlines(keepends=True)[:3]
    path.write_text("".join(lines))
    cut = {"lines": 3, "hash": json.loads(lines[-1])["hash"]}
    mine = Ed25519PrivateKey.generate()
    for head in (cut, {**cut, "sig": old["sig"]}, {**cut, "sig": mine.sign(head_message(3, cut["hash"])).hex()}):
        head_path.write_text(json.dumps(head))
        result = verify_audit_log(path)
        assert not result.ok, head
        assert "unsigned" in result.problem or "does not carry the coordinator key's signature" in result.problem


def test_lines_appended_without_the_key_are_a_failure(tmp_path):
    path = _log_with(tmp_path, 3)
    _forge_line(path, "forged")
    result = verify_audit_log(path)
    assert not result.ok and result.line == 4 and "after the signed head" in result.problem
    AuditLog(path).append(AuditEvent("accept"))  # a later append by the coordinator signs a head over it
    assert verify_audit_log(path).ok  # so verify early and often: the labs' receipts are the witness beyond


def test_verify_checks_the_head_with_the_key_the_labs_hold(tmp_path, capsys):
    """An attacker who can write the state dir replaces coordinator.key and .pub and signs a cut
    log: STATE/coordinator.pub agrees, the labs' copy (--coordinator-key) does not."""
    import shutil

    from hacfed.keys import ensure_key_pair

    path = _log_with(tmp_path, 4)
    labs_copy = tmp_path / "labs-coordinator.pub"
    shutil.copy(tmp_path / "coordinator.pub", labs_copy)
    assert server_main(["audit", "verify", "--state-dir", str(tmp_path), "--coordinator-key", str(labs_copy)]) == 0
    assert "4 lines, hash chain intact, head signed by the coordinator key" in capsys.readouterr().out
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:2]))
    for name in ("coordinator.key", "coordinator.pub", "audit.log.head"):
        (tmp_path / name).unlink()
    ensure_key_pair(tmp_path, "coordinator")
    AuditLog(path).append(AuditEvent("accept"))
    assert verify_audit_log(path).ok  # the attacker's own key agrees with itself
    assert server_main(["audit", "verify", "--state-dir", str(tmp_path), "--coordinator-key", str(labs_copy)]) == 1
    assert "does not carry the coordinator key's signature" in capsys.readouterr().out


def test_no_public_key_to_check_the_head_is_a_failure(tmp_path):
    path = _log_with(tmp_path, 2)
    (tmp_path / "coordinator.pub").unlink()
    result = verify_audit_log(path)
    assert not result.ok and "coordinator's public key" in result.problem


def test_the_head_is_signed_with_the_key_hacfed_server_signs_with(tmp_path):
    """The log's key is the coordinator key of its state dir: the one hacfed-server makes, loads and
    gives the labs as coordinator.pub."""
    from hacfed.envelope import load_private_key
    from hacfed.keys import fingerprint
    from hacfed.server.config import COORDINATOR_KEY_STEM

    cfg = make_config(tmp_path)
    AuditLog(cfg.audit_path).append(AuditEvent("accept"))
    key = load_private_key(cfg.audit_path.parent / f"{COORDINATOR_KEY_STEM}.key")
    assert json.loads(cfg.audit_path.with_name("audit.log.head").read_text())["key"] == fingerprint(key.public_key())
    assert verify_audit_log(cfg.audit_path, key.public_key()).ok


def test_an_unusable_coordinator_key_writes_no_line(tmp_path):
    from hacfed.server.audit import AuditError

    path = _log_with(tmp_path, 2)
    before = path.read_bytes()
    (tmp_path / "coordinator.key").chmod(0o644)
    with pytest.raises(AuditError, match="coordinator key that signs its head cannot be loaded"):
        AuditLog(path).append(AuditEvent("accept"))
    assert path.read_bytes() == before
