"""Revocation is `hacfed-server revoke`; key files deleted by hand take a lab out too, but its old
enrolment must never register again, and `revoke` afterwards records the revocation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hacfed.clients.enrol import ensure_lab_keys
from hacfed.clients.main import main as client_main
from hacfed.enrolment import ENROLMENT_FILE, parse_enrolment
from hacfed.server.audit import verify_audit_log
from hacfed.server.main import main as server_main
from hacfed.server.registry import DELETED_BY_HAND, ENROLLED_DIR, REVOKED_DIR, load_registry, register


def _registered(tmp_path: Path, pid: str = "lab-b") -> tuple[Path, Path]:
    ensure_lab_keys(tmp_path / pid, pid)
    state, enrolment = tmp_path / "server", tmp_path / pid / ENROLMENT_FILE
    assert server_main(["register", "--state-dir", str(state), str(enrolment)]) == 0
    return state, enrolment


def _delete_by_hand(state: Path, pid: str = "lab-b") -> None:
    (state / "keys" / f"{pid}.pub").unlink()
    (state / "keys" / "supernodes" / f"{pid}.pub").unlink()


def test_keys_deleted_by_hand_are_never_registered_again(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    state, enrolment = _registered(tmp_path)
    _delete_by_hand(state)
    assert "lab-b" not in load_registry(state / "keys").entries  # out, as the driver sees it
    capsys.readouterr()
    assert server_main(["register", "--state-dir", str(state), str(enrolment)]) == 2  # the old enrolment
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "registered before and its key files were removed without hacfed-server revoke" in err and "--rotate" in err
    assert "lab-b" not in load_registry(state / "keys").entries
    assert client_main(["keys", "--state-dir", str(tmp_path / "lab-b"), "--participant-id", "lab-b", "--rotate"]) == 0
    assert server_main(["register", "--state-dir", str(state), str(enrolment)]) == 0  # new keys: fine
    assert "lab-b" in load_registry(state / "keys").entries


def test_revoke_after_a_deletion_by_hand_records_the_revocation(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    state, enrolment = _registered(tmp_path)
    _delete_by_hand(state)
    assert server_main(["revoke", "--state-dir", str(state), "lab-b"]) == 0
    records = list((state / "keys" / REVOKED_DIR).glob("lab-b-*"))
    assert len(records) == 1 and (records[0] / "signing.pub").is_file() and (records[0] / "supernode.pub").is_file()
    assert (records[0] / DELETED_BY_HAND).is_file()
    lines = [json.loads(x) for x in (state / "audit.log").read_text().splitlines()]
    assert [(r["kind"], r["participant"]) for r in lines] == [("register", "lab-b"), ("revoke", "lab-b")]
    assert verify_audit_log(state / "audit.log").ok
    capsys.readouterr()
    assert server_main(["register", "--state-dir", str(state), str(enrolment)]) == 2
    assert "was revoked before" in capsys.readouterr().err
    assert server_main(["revoke", "--state-dir", str(state), "lab-b"]) == 2  # nothing left to revoke
    assert "lab-b is not registered" in capsys.readouterr().err


def test_a_registration_the_audit_log_cannot_record_leaves_no_record(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture) -> None:
    ensure_lab_keys(tmp_path / "lab-b", "lab-b")
    state, enrolment = tmp_path / "server", tmp_path / "lab-b" / ENROLMENT_FILE
    (state / "audit.log").mkdir(parents=True)  # not writable as a log
    assert server_main(["register", "--state-dir", str(state), str(enrolment)]) == 2
    assert "so it was undone" in capsys.readouterr().err
    assert load_registry(state / "keys").entries == {} and not any((state / "keys" / ENROLLED_DIR).iterdir())
    (state / "audit.log").rmdir()
    assert server_main(["register", "--state-dir", str(state), str(enrolment)]) == 0  # not "registered before"


def test_a_revocation_of_deleted_keys_the_audit_log_cannot_record_is_undone(tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture) -> None:
    state, _ = _registered(tmp_path)
    _delete_by_hand(state)
    (state / "audit.log").rename(tmp_path / "audit.log.saved")
    (state / "audit.log").mkdir()
    assert server_main(["revoke", "--state-dir", str(state), "lab-b"]) == 2
    assert "so it was undone" in capsys.readouterr().err
    assert not (state / "keys" / REVOKED_DIR).exists() or not any((state / "keys" / REVOKED_DIR).iterdir())
    assert "lab-b" not in load_registry(state / "keys").entries  # the undo re-registered nothing


def test_registering_again_repairs_a_missing_enrolled_record(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    enrolment = parse_enrolment(ensure_lab_keys(tmp_path / "lab-b", "lab-b").line)
    register(keys, enrolment)
    (record,) = (keys / ENROLLED_DIR).iterdir()
    for path in record.iterdir():
        path.unlink()
    register(keys, enrolment)  # idempotent, and it writes the record a crash cut off
    assert sorted(p.name for p in record.iterdir()) == ["signing.pub", "supernode.pub"]
