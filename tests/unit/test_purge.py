"""R11, the coordinator's side: `hacfed-server purge --participant X --from-round R` withdraws X's
samples from later pools, quarantines X, is audited, and lists what each lab must replay. The lab's
side (`hacfed-client replay`) is tested in tests/unit/test_client_replay.py."""

from __future__ import annotations

import json
import sqlite3

from hacfed.server.coordinator import Coordinator, ErrorCode, Journal, run_rounds
from hacfed.server.coordinator.audit import AuditLog, verify_audit_log
from hacfed.server.main import main as server_main
from tests.unit.test_coordinator_fakes import TASK, FakeClock, ScriptedEndpoint, make_config, scripted_submission


def _run(tmp_path, rounds=3):
    clock = FakeClock()
    cfg = make_config(tmp_path, rounds=rounds, expected_participants=3)
    journal = Journal(cfg.journal_path, audit=AuditLog(cfg.audit_path, clock=clock))
    coord = Coordinator(cfg, TASK, journal, clock=clock)
    run_rounds(coord, [ScriptedEndpoint("lab-a"), ScriptedEndpoint("lab-b"), ScriptedEndpoint("lab-x")],
               sleep=clock.sleep)
    journal.close()
    return cfg


def test_purge_withdraws_samples_quarantines_and_lists_each_lab(tmp_path, capsys):
    cfg = _run(tmp_path)
    state = str(tmp_path)
    assert server_main(["purge", "--state-dir", state, "--participant", "lab-x", "--from-round", "1", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "DRY RUN: would withdraw lab-x's samples of rounds [1, 2]" in out
    with Journal(cfg.journal_path) as journal:
        assert {t.source_id for t in journal.pool(1)} == {"lab-a", "lab-b", "lab-x"}  # a dry run changes nothing

    assert server_main(["purge", "--state-dir", state, "--participant", "lab-x", "--from-round", "1"]) == 0
    out = capsys.readouterr().out
    assert "purged lab-x from round 1: withdrew 12 samples ({1: 6, 2: 6}) from the pools of rounds [1, 2]" in out
    # lab-a and lab-b reported training on pools 0, 1 and 2 (their round-1, round-2 and final reports)
    for lab in ("lab-a", "lab-b"):
        assert f"{lab} trained on affected pools [1, 2]: it must roll back and replay without lab-x" in out
    assert ("hacfed-client replay --state-dir <lab-a's state dir> --model <its model> --exclude lab-x "
            "--from-round 1") in out
    with Journal(cfg.journal_path) as journal:
        assert {t.source_id for t in journal.pool(0)} == {"lab-a", "lab-b", "lab-x"}  # before R: kept
        assert {t.source_id for t in journal.pool(1)} == {"lab-a", "lab-b"}
        assert {t.source_id for t in journal.pool(2)} == {"lab-a", "lab-b"}
        assert journal.participant("lab-x").quarantined
        assert [e["kind"] for e in journal.events("purge")] == ["purge"]
    lines = [json.loads(x) for x in cfg.audit_path.read_text().splitlines()]
    assert lines[-1]["kind"] == "purge" and lines[-1]["participant"] == "lab-x" and lines[-1]["round"] == 1
    assert verify_audit_log(cfg.audit_path).ok

    # a second purge finds nothing left to withdraw, and still lists the labs
    assert server_main(["purge", "--state-dir", state, "--participant", "lab-x", "--from-round", "1"]) == 0
    assert "withdrew 0 samples (none left)" in capsys.readouterr().out


def test_purged_participant_is_refused_and_later_pools_exclude_it(tmp_path):
    cfg = _run(tmp_path, rounds=4)
    with Journal(cfg.journal_path) as journal:  # rewind: pretend round 3 is still to come
        journal.purge("lab-x", 2, 0.0, "test")
    clock = FakeClock()
    coord = Coordinator(cfg, TASK, Journal(cfg.journal_path), clock=clock)
    assert coord.journal.participant("lab-x").quarantined
    with sqlite3.connect(cfg.journal_path) as db:
        purged = db.execute("SELECT COUNT(*) FROM trajectories WHERE purged=1").fetchone()[0]
    assert purged == 12  # rounds 2 and 3
    update = coord.engine.round_update(3)  # the pool of round 2 as it would be published now
    assert update.pool and {t.source_id for t in update.pool} == {"lab-a", "lab-b"}
    assert "lab-x" not in update.participants
    late = scripted_submission(coord.plan_for(3), "lab-x", nonce="ab" * 16)  # new content from lab-x
    assert coord.submit(late).refusal == ErrorCode.QUARANTINED


def test_purge_errors_are_one_line(tmp_path, capsys):
    _run(tmp_path)
    assert server_main(["purge", "--state-dir", str(tmp_path), "--participant", "nobody", "--from-round", "0"]) == 2
    assert "error: 'nobody' never joined this run" in capsys.readouterr().err
    assert server_main(["purge", "--state-dir", str(tmp_path / "none"), "--participant", "x", "--from-round", "0"]) == 2
    assert "no journal at" in capsys.readouterr().err
