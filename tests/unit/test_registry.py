"""Onboarding and revocation: the lab's keys and enrolment line, the operator's register/revoke, the registry.

One command on each side (issue 9): `hacfed-client keys` prints the enrolment, `hacfed-server
register` admits it, `hacfed-server revoke` takes the lab out. The registry never lets an invalid
id reach a path, and reading it never crashes on a bad file (issue 9, reproduction 6).
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from hacfed.clients.enrol import ensure_lab_keys
from hacfed.clients.main import main as client_main
from hacfed.enrolment import ENROLMENT_FILE, SUPERNODE_KEY, load_supernode_private_key, make_enrolment, parse_enrolment
from hacfed.envelope import generate_key, key_id, save_public_key
from hacfed.server.main import main as server_main
from hacfed.server.registry import REVOKED_DIR, load_registry, register, register_signing_key, revoke


def _enrol(tmp_path: Path, pid: str) -> str:
    return ensure_lab_keys(tmp_path / pid, pid).line


def test_lab_keys_command_prints_one_enrolment_line_and_keeps_private_keys_private(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    state = tmp_path / "lab-b"
    assert client_main(["keys", "--state-dir", str(state), "--participant-id", "lab-b"]) == 0
    out = capsys.readouterr().out.splitlines()
    line = out[-1]
    assert line.startswith("hacfed-enrolment/v1 lab-b ed25519:") and "ecdsa-sha2-nistp384:" in line
    assert (state / ENROLMENT_FILE).read_text().strip() == line
    assert "signing key" in out[0] and "SuperNode key" in out[0]  # the fingerprints to compare
    for private in ("participant.key", "supernode.key"):
        assert stat.S_IMODE((state / private).stat().st_mode) == 0o600
    assert client_main(["keys", "--state-dir", str(state), "--participant-id", "lab-b"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == line  # idempotent: the same keys


def test_lab_keys_command_refuses_an_invalid_id(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert client_main(["keys", "--state-dir", str(tmp_path), "--participant-id", "../x"]) == 2
    assert "--participant-id must be 1-63 characters" in capsys.readouterr().err
    assert not (tmp_path / "participant.key").exists()


def test_operator_registers_a_lab_with_one_command(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    _enrol(tmp_path, "lab-b")
    state = tmp_path / "server"
    assert server_main(["register", "--state-dir", str(state), str(tmp_path / "lab-b" / ENROLMENT_FILE)]) == 0
    assert "registered lab-b: signing key" in capsys.readouterr().out
    entry = load_registry(state / "keys").entries["lab-b"]
    lab = ensure_lab_keys(tmp_path / "lab-b", "lab-b")
    assert key_id(entry.signing_key) == key_id(lab.enrolment.signing_key)
    assert entry.supernode_path is not None and entry.supernode_path.read_text().startswith("ecdsa-sha2-nistp384 ")
    assert server_main(["labs", "--state-dir", str(state)]) == 0
    assert capsys.readouterr().out.startswith("lab-b: signing key")


def test_operator_revokes_a_lab_with_one_command(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    state = tmp_path / "server"
    register(state / "keys", parse_enrolment(_enrol(tmp_path, "lab-b")))
    assert server_main(["revoke", "--state-dir", str(state), "lab-b"]) == 0
    assert "revoked lab-b" in capsys.readouterr().out
    assert "lab-b" not in load_registry(state / "keys").entries
    assert len(list((state / "keys" / REVOKED_DIR).glob("lab-b-*/signing.pub"))) == 1
    assert server_main(["revoke", "--state-dir", str(state), "lab-b"]) == 2
    assert "lab-b is not registered" in capsys.readouterr().err


def test_a_revoked_key_is_never_registered_again(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    line = _enrol(tmp_path, "lab-b")
    register(keys, parse_enrolment(line))
    revoke(keys, "lab-b")
    with pytest.raises(ValueError, match="was revoked before; the lab must create new keys .* --rotate"):
        register(keys, parse_enrolment(line))
    assert client_main(["keys", "--state-dir", str(tmp_path / "lab-b"), "--participant-id", "lab-b", "--rotate"]) == 0
    register(keys, parse_enrolment((tmp_path / "lab-b" / ENROLMENT_FILE).read_text()))  # new keys: fine
    assert "lab-b" in load_registry(keys).entries


def test_register_refuses_to_rebind_an_id_or_share_a_key(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    register(keys, parse_enrolment(_enrol(tmp_path, "lab-a")))
    register(keys, parse_enrolment(_enrol(tmp_path, "lab-a")))  # the same enrolment again: idempotent
    with pytest.raises(ValueError, match="lab-a is already registered with other keys; revoke it first"):
        register(keys, parse_enrolment(_enrol(tmp_path / "other", "lab-a")))
    lab_a = ensure_lab_keys(tmp_path / "lab-a", "lab-a")
    node_key = load_supernode_private_key(tmp_path / "lab-a" / SUPERNODE_KEY)
    stolen = make_enrolment("lab-z", lab_a.private_key, node_key)  # lab-a's keys, another id
    with pytest.raises(ValueError, match="already registered for lab-a"):
        register(keys, parse_enrolment(stolen))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda line: line.replace("lab-b", "lab-c", 1), "not signed by its own signing key"),
        (lambda line: line[:-6] + ("AAAAAA" if not line.endswith("AAAAAA") else "BBBBBB"),
         "signing key or signature|not signed"),
        (lambda line: line.replace("lab-b", "../../x", 1), "participant id must be 1-63 characters"),
        (lambda line: line.replace("lab-b", "lab\nb", 1), "not a hacfed-enrolment/v1 line|must be 1-63"),
        (lambda line: "hello world", "not a hacfed-enrolment/v1 line"),
        (lambda line: "", "no enrolment line found"),
    ],
)
def test_a_tampered_or_malformed_enrolment_is_refused(tmp_path: Path, edit, message: str) -> None:  # noqa: ANN001
    line = _enrol(tmp_path, "lab-b")
    with pytest.raises(ValueError, match=message):
        parse_enrolment(edit(line))


def test_register_command_reports_a_bad_enrolment_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    bad = tmp_path / "enrolment.txt"
    bad.write_text("hacfed-enrolment/v1 lab-b junk junk junk\n")
    assert server_main(["register", "--state-dir", str(tmp_path / "s"), str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hacfed-server register: error: malformed enrolment line") and "Traceback" not in err


# ---- the registry never lets an id reach a path, and never crashes on a bad file ----------------


@pytest.mark.parametrize("pid", ["../../escaped", "lab a", "Lab-A", "lab/a", "lab\na", ".hidden", "a" * 64, ""])
def test_an_invalid_id_never_becomes_a_key_file(tmp_path: Path, pid: str) -> None:
    keys = tmp_path / "deep" / "keys"
    keys.mkdir(parents=True)
    with pytest.raises(ValueError, match="participant id must be"):
        register_signing_key(keys, pid, generate_key().public_key())
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_a_key_file_with_an_invalid_name_is_ignored_not_fatal(tmp_path: Path) -> None:
    """reproduction 6: an id with a space left `keys/lab a.pub`, and every later start failed."""
    save_public_key(generate_key().public_key(), tmp_path / "lab a.pub")
    save_public_key(generate_key().public_key(), tmp_path / "lab-b.pub")
    registry = load_registry(tmp_path)
    assert list(registry.entries) == ["lab-b"]
    assert registry.problems == ("ignored 'lab a.pub' in " + str(tmp_path) + ": not a valid participant id",)


def test_a_key_registered_under_two_ids_admits_neither(tmp_path: Path) -> None:
    key = generate_key().public_key()
    save_public_key(key, tmp_path / "lab-a.pub")
    save_public_key(key, tmp_path / "lab-z.pub")
    save_public_key(generate_key().public_key(), tmp_path / "lab-b.pub")
    registry = load_registry(tmp_path)
    assert list(registry.entries) == ["lab-b"] and len(registry.problems) == 2


def test_an_unreadable_key_is_reported_not_fatal(tmp_path: Path) -> None:
    (tmp_path / "lab-a.pub").write_text("garbage")
    registry = load_registry(tmp_path)
    assert registry.entries == {} and "not a PEM public key" in registry.problems[0]


def test_registrations_and_revocations_are_in_the_audit_log(tmp_path: Path) -> None:
    from hacfed.server.audit import verify_audit_log

    state = tmp_path / "server"
    _enrol(tmp_path, "lab-b")
    assert server_main(["register", "--state-dir", str(state), str(tmp_path / "lab-b" / ENROLMENT_FILE)]) == 0
    assert server_main(["register", "--state-dir", str(state), str(tmp_path / "lab-b" / ENROLMENT_FILE)]) == 0
    assert server_main(["revoke", "--state-dir", str(state), "lab-b"]) == 0
    lines = [json.loads(line) for line in (state / "audit.log").read_text().splitlines()]
    assert [(r["kind"], r["participant"]) for r in lines] == [("register", "lab-b"), ("revoke", "lab-b")]
    assert verify_audit_log(state / "audit.log").ok


def test_a_revocation_the_audit_log_cannot_record_is_undone(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    state = tmp_path / "server"
    register(state / "keys", parse_enrolment(_enrol(tmp_path, "lab-b")))
    (state / "audit.log").mkdir()  # not writable as a log
    assert server_main(["revoke", "--state-dir", str(state), "lab-b"]) == 2
    assert "could not record the revoke of lab-b, so it was undone" in capsys.readouterr().err
    assert "lab-b" in load_registry(state / "keys").entries
