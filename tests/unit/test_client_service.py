"""The participant service (hacfed-client's side of the exchange): checks, clear errors, the outbox."""

from __future__ import annotations

import grpc
import pytest

from hacfed.clients.relay import ParticipantRejection, RelayError, call_participant, serve_participant
from hacfed.clients.service import ParticipantService
from hacfed.envelope import DOMAIN_SUBMIT, DOMAIN_UPDATE, key_id, open_envelope, seal
from hacfed.exchange import open_lab_reply, seal_delivery
from hacfed.keys import KEY_REQUEST_TYPE, ensure_key_pair
from hacfed.messages import RoundUpdate
from hacfed.server.coordinator import Coordinator, Journal
from hacfed.server.membership import read_key_offer
from hacfed.tasks.arithmetic import ArithmeticTask
from hacfed.wire import PayloadType, decode_submission, encode_round_update
from tests.lying_lab import LyingParticipant, falsify_rewards
from tests.unit.test_coordinator_fakes import TASK, FakeClock, make_config
from tests.unit.test_server_driver import ScriptedParticipant


@pytest.fixture
def setup(tmp_path):
    """A coordinator with round 0 open, its key, and a participant service for lab-a."""
    cfg = make_config(tmp_path / "server")
    coordinator = Coordinator(cfg, TASK, Journal(cfg.journal_path), clock=FakeClock())
    coordinator.register("lab-a")
    coordinator.open_round(0)
    coordinator_key = ensure_key_pair(tmp_path / "server", "coordinator").load()
    participant_key = ensure_key_pair(tmp_path / "lab-a", "participant").load()
    participant = ScriptedParticipant("lab-a")

    def service(task=TASK, trusted=coordinator_key.public_key(), lab=participant, **kw) -> ParticipantService:
        return ParticipantService(lab, task, participant_key, trusted, tmp_path / "lab-a", **kw)

    def sealed(update: RoundUpdate, key=coordinator_key, domain=DOMAIN_UPDATE) -> bytes:
        """A delivery whose request is `update`, as the coordinator's driver sends it."""
        return seal_delivery((), seal(encode_round_update(update), PayloadType.ROUND_UPDATE, key, domain), key)

    return coordinator, service, sealed, participant, participant_key


def submission_of(reply: bytes, key):
    """The submission a LabReply carries, its signatures checked with the participant's key."""
    trusted = {key_id(key.public_key()): key.public_key()}
    lab_reply, _ = open_lab_reply(reply, trusted)
    payload, _ = open_envelope(lab_reply.submission, trusted, DOMAIN_SUBMIT, PayloadType.SUBMISSION)
    return decode_submission(payload)


def _rejection(call) -> ParticipantRejection:
    with pytest.raises(ParticipantRejection) as info:
        call()
    return info.value


def test_an_update_is_answered_with_a_signed_submission(setup) -> None:
    coordinator, service, sealed, participant, key = setup
    reply = service().handle(sealed(coordinator.engine.round_update(0)))
    submission = submission_of(reply, key)
    assert submission.participant_id == "lab-a" and submission.round_id == 0
    assert len(submission.trajectories) == 2 * 3
    assert coordinator.submit(submission, sender="lab-a").rejected == ()


def test_identical_retried_update_gets_the_cached_reply_and_trains_once(setup) -> None:
    coordinator, service, sealed, participant, _ = setup
    request = sealed(coordinator.engine.round_update(0))
    first = service()
    reply = first.handle(request)
    assert first.handle(request) == reply
    restarted = service()  # a new process on the same state dir: the cache is on disk
    assert restarted.handle(request) == reply
    assert first.steps == 1 and restarted.steps == 0 and len(participant.updates) == 1


@pytest.mark.parametrize(
    ("mutate", "status", "code", "words"),
    [
        (lambda b: b"not an envelope", grpc.StatusCode.INVALID_ARGUMENT, "HACFED-E-SCHEMA", "refused"),
        (lambda b: b[:10] + bytes([b[10] ^ 1]) + b[11:], grpc.StatusCode.UNAUTHENTICATED, "HACFED-E-SIGNATURE",
         "not signed by the coordinator key"),
    ],
)
def test_bad_envelopes_are_clear_errors(setup, mutate, status, code, words) -> None:
    coordinator, service, sealed, participant, _ = setup
    error = _rejection(lambda: service().handle(mutate(sealed(coordinator.engine.round_update(0)))))
    assert (error.status, error.code) == (status, code) and words in error.message
    assert participant.updates == []


def test_update_signed_by_another_key_or_for_another_purpose_is_unauthenticated(setup, tmp_path) -> None:
    coordinator, service, sealed, participant, participant_key = setup
    update = coordinator.engine.round_update(0)
    impostor = ensure_key_pair(tmp_path / "impostor", "coordinator").load()
    error = _rejection(lambda: service().handle(sealed(update, key=impostor)))
    assert error.status == grpc.StatusCode.UNAUTHENTICATED and error.code == "HACFED-E-UNAUTHENTICATED"
    assert "--coordinator-key" in error.message
    wrong_domain = _rejection(lambda: service().handle(sealed(update, domain=DOMAIN_SUBMIT)))
    assert wrong_domain.code == "HACFED-E-SIGNATURE" and wrong_domain.status == grpc.StatusCode.UNAUTHENTICATED
    assert participant.updates == []


def test_plan_prompts_unknown_to_the_local_task_are_a_task_mismatch(setup) -> None:
    coordinator, service, sealed, participant, _ = setup
    other_task = ArithmeticTask(digits=3, num_train=200, num_eval=20)
    error = _rejection(lambda: service(task=other_task).handle(sealed(coordinator.engine.round_update(0))))
    assert error.status == grpc.StatusCode.FAILED_PRECONDITION and error.code == "HACFED-E-TASK-MISMATCH"
    assert error.message.startswith("task mismatch: plan prompt 'add2:") and "arith-add3" in error.message
    assert participant.updates == []


def test_stale_and_foreign_run_updates_are_refused(setup) -> None:
    coordinator, service, sealed, participant, key = setup
    svc = service()
    round0 = sealed(coordinator.engine.round_update(0))
    first = submission_of(svc.handle(round0), key)
    coordinator.submit(first, sender="lab-a")
    coordinator.close_round(coordinator.poll() or "deadline")
    coordinator.open_round(1)
    svc.handle(sealed(coordinator.engine.round_update(1)))
    # a replay of an older round's update gets the same signed submission back from the outbox ...
    assert submission_of(svc.handle(round0), key) == first and svc.steps == 2
    with svc.outbox._lock:  # ... and without that entry, it is stale: the participant never goes back
        svc.outbox._db.execute("DELETE FROM outbox WHERE round_id=0")
    error = _rejection(lambda: svc.handle(round0))
    assert error.code == "HACFED-E-STALE-ROUND" and error.status == grpc.StatusCode.FAILED_PRECONDITION
    assert [u.pool_round for u in participant.updates] == [None, 0]
    foreign = RoundUpdate(**{**coordinator.engine.round_update(0).__dict__, "run_id": "other-run", "next_plan": None,
                             "pool_round": None})
    error = _rejection(lambda: svc.handle(sealed(foreign)))
    assert error.code == "HACFED-E-WRONG-RUN" and "fresh --state-dir" in error.message


def test_key_request_is_answered_with_a_self_signed_key_offer(setup) -> None:
    coordinator, service, _, _, participant_key = setup
    coordinator_key = ensure_key_pair(service().state_dir.parent / "server", "coordinator").load()
    offer = service().handle(seal(b"", KEY_REQUEST_TYPE, coordinator_key, DOMAIN_UPDATE))
    assert key_id(read_key_offer(offer)) == key_id(participant_key.public_key())


def test_errors_reach_the_relay_as_codes_over_grpc(setup) -> None:
    coordinator, service, sealed, _, _ = setup
    server, port = serve_participant(service(task=ArithmeticTask(digits=3, num_train=200, num_eval=20)).handle)
    try:
        with pytest.raises(RelayError) as info:
            call_participant(f"127.0.0.1:{port}", sealed(coordinator.engine.round_update(0)), timeout_s=10.0)
        assert info.value.code == "HACFED-E-TASK-MISMATCH"
        with pytest.raises(RelayError) as info:
            call_participant(f"127.0.0.1:{port}", b"\x00garbage", timeout_s=10.0)
        assert info.value.code == "HACFED-E-SCHEMA"
    finally:
        server.stop(0).wait()


def test_the_lying_lab_double_signs_the_opposite_of_every_claim(setup) -> None:
    """tests/lying_lab.py, the lab the integration tests use to earn strikes, wraps the real service."""
    coordinator, service, sealed, participant, key = setup
    reply = service(lab=LyingParticipant(participant)).handle(sealed(coordinator.engine.round_update(0)))
    cheated = submission_of(reply, key)
    assert [t.reward for t in falsify_rewards(cheated).trajectories] == [1.0, 0.0, 0.0] * 2  # the honest claims
    result = coordinator.submit(cheated, sender="lab-a")
    assert result.accepted_ids == () and coordinator.journal.participant("lab-a").strikes >= 1
