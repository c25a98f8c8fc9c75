"""The lab's outbox (security.md "Nothing lost", R5) and the lost round of issue 9: "a lab killed after its
checkpoint but before caching its reply loses that round (HACFED-E-STALE-ROUND on the resend)".

The participant here is scripted but checkpoints for real (hacfed.clients.checkpoints, with its
mid_checkpoint crash point) and is killed in a child process, then restarted from its state dir.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hacfed.clients.checkpoints import latest_checkpoint, read_state, save_checkpoint
from hacfed.clients.outbox import Outbox
from hacfed.clients.service import OUTBOX_FILE, ParticipantService
from hacfed.crashpoints import CRASH_EXIT_CODE
from hacfed.envelope import DOMAIN_UPDATE, seal
from hacfed.exchange import seal_delivery
from hacfed.keys import ensure_key_pair
from hacfed.wire import PayloadType, encode_round_update
from tests.unit.test_client_service import submission_of
from tests.unit.test_coordinator_fakes import TASK, FakeClock, make_coordinator
from tests.unit.test_server_driver import ScriptedParticipant

REPO = Path(__file__).resolve().parents[2]
EXIT_AFTER_CHECKPOINT = "HACFED_TEST_EXIT_AFTER_CHECKPOINT"


class CheckpointingParticipant(ScriptedParticipant):
    """Checkpoints its progress atomically after each step and resumes from it when built."""

    def __init__(self, participant_id: str, directory: Path) -> None:
        super().__init__(participant_id)
        self.directory = Path(directory)
        latest = latest_checkpoint(self.directory)
        if latest is not None:
            state = read_state(latest)
            self.last_round, self.last_pool_round = state["round"], state["pool_round"]

    def step(self, update, before_checkpoint=None):
        def then_checkpoint(submission):
            if before_checkpoint is not None:
                before_checkpoint(submission)
            state = {"round": self.last_round, "pool_round": self.last_pool_round}
            save_checkpoint(self.directory, self.last_round or 0,
                            lambda tmp: (tmp / "state.json").write_text(json.dumps(state)))
            if os.environ.get(EXIT_AFTER_CHECKPOINT):
                os._exit(87)  # killed after the checkpoint, before the reply left

        return super().step(update, before_checkpoint=then_checkpoint)


def _lab(tmp_path: Path) -> ParticipantService:
    return ParticipantService(
        CheckpointingParticipant("lab-a", tmp_path / "lab-a" / "checkpoints"), TASK,
        ensure_key_pair(tmp_path / "lab-a", "participant").load(),
        ensure_key_pair(tmp_path / "server", "coordinator").load().public_key(), tmp_path / "lab-a" / "service",
    )


CHILD = textwrap.dedent("""
    import sys
    from pathlib import Path
    sys.path.insert(0, {repo!r})
    from tests.unit.test_client_outbox import _lab
    tmp = Path({tmp!r})
    _lab(tmp).handle((tmp / "request.bin").read_bytes())
    print("replied", flush=True)
""")


def _kill_while_answering(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    code = CHILD.format(repo=str(REPO), tmp=str(tmp_path))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False,
                          env={**os.environ, **env})


@pytest.fixture
def round0(tmp_path):
    """A coordinator with round 0 open and the delivery of its update written to request.bin."""
    coordinator = make_coordinator(tmp_path / "server", FakeClock())
    coordinator.register("lab-a")
    coordinator.open_round(0)
    key = ensure_key_pair(tmp_path / "server", "coordinator").load()
    update = seal(encode_round_update(coordinator.engine.round_update(0)), PayloadType.ROUND_UPDATE, key, DOMAIN_UPDATE)
    (tmp_path / "request.bin").write_bytes(seal_delivery((), update, key))
    return coordinator


def test_lab_killed_after_its_checkpoint_resends_the_same_submission(tmp_path, round0):
    coordinator = round0
    killed = _kill_while_answering(tmp_path, {EXIT_AFTER_CHECKPOINT: "1"})
    assert killed.returncode == 87, killed.stderr
    outbox = Outbox(tmp_path / "lab-a" / "service" / OUTBOX_FILE)
    [written] = outbox.pending()
    outbox.close()
    restarted = _lab(tmp_path)  # the same state dir, resumed from the checkpoint of round 0
    assert restarted.participant.last_round == 0
    reply = restarted.handle((tmp_path / "request.bin").read_bytes())  # the coordinator retries the update
    key = ensure_key_pair(tmp_path / "lab-a", "participant").load()
    submission = submission_of(reply, key)
    assert restarted.steps == 0  # not trained again ...
    assert submission.nonce == written.nonce  # ... the submission from before the kill, same nonce, same bytes
    result = coordinator.submit(submission, sender="lab-a")
    assert result.recorded and result.rejected == ()  # was HACFED-E-STALE-ROUND: the round was lost


def test_lab_killed_mid_checkpoint_runs_the_step_again(tmp_path, round0):
    coordinator = round0
    killed = _kill_while_answering(tmp_path, {"HACFED_CRASH_AT": "mid_checkpoint"})
    assert killed.returncode == CRASH_EXIT_CODE, killed.stderr
    notices: list[str] = []
    restarted = ParticipantService(
        CheckpointingParticipant("lab-a", tmp_path / "lab-a" / "checkpoints"), TASK,
        ensure_key_pair(tmp_path / "lab-a", "participant").load(),
        ensure_key_pair(tmp_path / "server", "coordinator").load().public_key(), tmp_path / "lab-a" / "service",
        on_notice=notices.append,
    )
    assert restarted.participant.last_round is None  # the checkpoint never completed
    assert any("dropped the unsent reply" in n for n in notices)  # its outbox entry was never sent
    reply = restarted.handle((tmp_path / "request.bin").read_bytes())
    assert restarted.steps == 1  # the step runs again from the previous checkpoint
    result = coordinator.submit(submission_of(reply, ensure_key_pair(tmp_path / "lab-a", "participant").load()),
                                sender="lab-a")
    assert result.recorded and result.rejected == ()


def test_outbox_is_wal_with_full_sync_and_keeps_entries_until_answered(tmp_path):
    outbox = Outbox(tmp_path / "outbox.sqlite")
    assert outbox.pragma("journal_mode") == "wal" and outbox.pragma("synchronous") == 2
    outbox.add(("run", None, 0), 0, "a" * 32, b"sealed-0")
    outbox.add(("run", 0, 1), 1, "b" * 32, b"sealed-1")
    assert [e.round_id for e in outbox.pending()] == [0, 1]
    assert [e.round_id for e in outbox.pending(exclude=("run", 0, 1))] == [0]
    assert outbox.settle("a" * 32, "acked", b"receipt-0").state == "pending"
    assert outbox.settle("a" * 32, "acked", b"another").answer == b"receipt-0"  # the first answer is kept
    assert outbox.counts() == {"pending": 1, "acked": 1, "refused": 0}
    outbox.close()
    reopened = Outbox(tmp_path / "outbox.sqlite")  # durable across a restart
    assert [e.nonce for e in reopened.pending()] == ["b" * 32]
