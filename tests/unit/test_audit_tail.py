"""The journal witnesses the audit log's tail (issue 31; security.md S10).

Deleting the last lines of audit.log and putting back an older signed head (or, with the
coordinator's key, signing a new one) gives a log and head that agree; the journal recorded the
last line's number and hash in the transaction of its decision, and `hacfed-server audit verify`
compares them.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from hacfed.server.audit import AuditEvent, AuditLog, verify_audit_log
from hacfed.server.coordinator.audit import _write_head
from hacfed.server.coordinator.audit_tail import TAIL_KEY, read_tail
from hacfed.server.main import main as server_main
from tests.unit.test_audit import _audited_coordinator
from tests.unit.test_coordinator_fakes import scripted_submission


def _run_some_rounds(tmp_path: Path) -> tuple[Path, str]:
    """A coordinator's audit log and journal; returns the log and its head as it was after line 3."""
    coord = _audited_coordinator(tmp_path)
    coord.register("a")
    plan = coord.open_round(0)  # line 2
    assert coord.submit(scripted_submission(plan, "a")).recorded  # line 3
    head = coord.cfg.audit_path.with_name("audit.log.head").read_text()
    coord.close_round("quorum")  # line 4
    plan = coord.open_round(1)  # line 5
    assert coord.submit(scripted_submission(plan, "a")).recorded  # line 6
    coord.journal.close()
    return coord.cfg.audit_path, head


def test_every_audited_decision_records_the_tail_in_its_transaction(tmp_path: Path, capsys) -> None:
    path, _ = _run_some_rounds(tmp_path)
    last = json.loads(path.read_text().splitlines()[-1])
    assert read_tail(tmp_path / "journal.sqlite") == (6, last["hash"]) == (last["id"], last["hash"])
    AuditLog(path).append(AuditEvent("register", participant="b"))  # an operator command: no journal
    assert server_main(["audit", "verify", "--state-dir", str(tmp_path)]) == 0
    assert "7 lines, hash chain intact" in capsys.readouterr().out  # the journal's line 6 is still there


@pytest.mark.parametrize("head", ["older", "re-signed"])
def test_lines_cut_from_the_end_with_a_matching_head_are_found_by_the_journal(tmp_path: Path, capsys,
                                                                              head: str) -> None:
    path, older = _run_some_rounds(tmp_path)
    kept = path.read_text().splitlines(keepends=True)[:3]
    path.write_text("".join(kept))
    head_path = path.with_name("audit.log.head")
    if head == "older":  # a copy of the signed head saved earlier
        head_path.write_text(older)
    else:  # whoever can read coordinator.key signs a head for the cut log
        _write_head(head_path, 3, json.loads(kept[-1])["hash"], AuditLog(path)._signing_key())
    assert verify_audit_log(path).ok  # log and head agree: without the journal the cut is invisible
    assert server_main(["audit", "verify", "--state-dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "FAILED verification: line 4: missing; the journal recorded line 6" in out, out


def test_a_rewritten_last_line_differs_from_the_journal(tmp_path: Path, capsys) -> None:
    """Lines 5 and 6 replaced by a different line 5 that chains and is signed with the key."""
    path, _ = _run_some_rounds(tmp_path)
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:4]))
    log = AuditLog(path)
    log.append(AuditEvent("round_open", round_id=1, detail="rewritten"))
    log.append(AuditEvent("round_close", round_id=1, code="deadline"))  # line 6, another hash
    assert verify_audit_log(path).ok
    assert server_main(["audit", "verify", "--state-dir", str(tmp_path)]) == 1
    assert "line 6: its hash differs from the one the journal recorded" in capsys.readouterr().out


def test_a_malformed_tail_is_one_line(tmp_path: Path, capsys) -> None:
    _run_some_rounds(tmp_path)
    with sqlite3.connect(tmp_path / "journal.sqlite") as db:
        db.execute("UPDATE meta SET value='x' WHERE key=?", (TAIL_KEY,))
    assert server_main(["audit", "verify", "--state-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hacfed-server: error: journal ") and "malformed audit tail" in err
    assert len(err.strip().splitlines()) == 1
