"""Atheris target for the envelope and payload decoders (security.md S4; docs/security.md "Fuzzing").

    python tests/faults/fuzz_decoders.py -max_total_time=60 CORPUS_DIR     # the CI smoke run
    python tests/faults/fuzz_decoders.py -atheris_runs=1000000 CORPUS_DIR  # a long run (10^6 executions)

    python tests/faults/fuzz_decoders.py crash-<sha1>                       # replay one input

Every argument is libFuzzer's (`-help=1` lists them), except that an empty (or missing) corpus
directory is first filled with seeds: valid encodings of every message kind, each behind its target
byte. The first byte of an input picks the target, the rest is what the target is fed:

- every `hacfed.wire` decoder on the bytes as they come (what a peer could send before anything is
  verified), and `hacfed.envelope.open_envelope` / `hacfed.exchange` openers with a fixed registry;
- the coordinator's path behind a VALID signature: the bytes are sealed with a registered key
  first, so the fuzzer reaches what a registered but hostile lab can feed the decoders
  (`open_lab_reply`, then `open_envelope` + `decode_submission` + `validate_submission`, as
  `hacfed.server.replies` does).

What counts as a finding (an uncaught exception, which libFuzzer reports as a crash):
- anything but a `WireError` (incl. `EnvelopeError`) escaping a decoder or opener;
- a decoded message that does not encode back to exactly the bytes it came from (decoding accepts
  only the canonical encoding, so what is signed and hashed is what hacfed acts on);
- `validate_submission`, `submission_digest` or `check_report` raising on a decoded submission.
"""

from __future__ import annotations

import sys
from pathlib import Path

import atheris

with atheris.instrument_imports(include=["hacfed"]):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from hacfed import wire
    from hacfed.envelope import DOMAIN_RECEIPT, DOMAIN_SUBMIT, DOMAIN_UPDATE, key_id, open_envelope, seal
    from hacfed.exchange import open_answer, open_delivery, open_lab_reply, seal_answer, seal_delivery, seal_lab_reply
    from hacfed.hacpo_config import HacpoConfig
    from hacfed.messages import RoundUpdate, StepReport, Submission
    from hacfed.server.coordinator.config import CoordinatorConfig
    from hacfed.server.coordinator.plan import make_plan
    from hacfed.server.coordinator.validation import (
        ValidationLimits,
        check_report,
        submission_digest,
        validate_submission,
    )
    from hacfed.tasks.arithmetic import ArithmeticTask
    from hacfed.trajectory import Trajectory
    from hacfed.wire import ErrorCode, PayloadType, WireError

# Fixed keys: the fuzzer must be deterministic for a given input (libFuzzer replays crashes).
LAB_KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(1, 33)))
COORDINATOR_KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(33, 65)))
TRUSTED = {key_id(k.public_key()): k.public_key() for k in (LAB_KEY, COORDINATOR_KEY)}
TASK = ArithmeticTask(digits=2, num_train=50, num_eval=5)
CONFIG = CoordinatorConfig.from_mapping(dict(
    run_id="fuzz", task={"kind": "arithmetic", "digits": 2, "num_train": 50, "num_eval": 5}, rounds=2,
    prompts_per_round=2, group_size=2, expected_participants=1, min_participants=1, round_deadline_s=60.0,
    state_dir="unused", sampling={"max_new_tokens": 8},
))
PLAN = make_plan(CONFIG, TASK, 0)
LIMITS = ValidationLimits(group_size=2, max_new_tokens=8, max_response_chars=4096, min_mean_logp=-50.0)

# name -> (decode, encode): decoded objects must encode back to the input bytes.
CODECS = {
    "envelope": (wire.decode_envelope, wire.encode_envelope),
    "submission": (wire.decode_submission, wire.encode_submission),
    "lab_reply": (wire.decode_lab_reply, wire.encode_lab_reply),
    "delivery": (wire.decode_delivery, wire.encode_delivery),
    "round_update": (wire.decode_round_update, wire.encode_round_update),
    "round_plan": (wire.decode_round_plan, wire.encode_round_plan),
    "receipt": (wire.decode_receipt, wire.encode_receipt),
    "refusal": (wire.decode_refusal, wire.encode_refusal),
    "error": (wire.decode_error, wire.encode_error),
    "step_report": (wire.decode_step_report, wire.encode_step_report),
    "trajectory": (wire.decode_trajectory, wire.encode_trajectory),
    "trajectory_batch": (wire.decode_trajectory_batch, wire.encode_trajectory_batch),
}


def _decode(name: str, data: bytes) -> None:
    decode, encode = CODECS[name]
    try:
        obj = decode(data)
    except WireError as exc:
        _check_code(exc)
        return
    again = encode(obj)
    if again != data:
        raise AssertionError(f"{name}: decoded {len(data)} bytes re-encode to {len(again)} other bytes")
    if isinstance(obj, Submission):
        _judge(obj)


def _judge(sub: Submission) -> None:
    """What the coordinator does with a decoded submission; none of it may raise."""
    submission_digest(sub)
    check_report(sub.report, sub.participant_id, sub.round_id)
    validate_submission(sub, PLAN, TASK, LIMITS)


def _check_code(exc: WireError) -> None:
    if not isinstance(exc.code, ErrorCode):
        raise AssertionError(f"WireError with a code outside the closed enum: {exc.code!r}")


def _open_raw(data: bytes) -> None:
    """The openers on bytes as they come (an outsider: no valid signature)."""
    for opener in (
        lambda: open_lab_reply(data, TRUSTED),
        lambda: open_delivery(data, TRUSTED),
        lambda: open_answer(data, TRUSTED),
        lambda: open_envelope(data, TRUSTED, DOMAIN_SUBMIT, PayloadType.SUBMISSION),
    ):
        try:
            opener()
        except WireError as exc:
            _check_code(exc)


def _signed_lab_reply(data: bytes) -> None:
    """A registered lab's signed LabReply around fuzzed bytes, taken apart as the driver does."""
    try:
        reply, _ = open_lab_reply(seal(data, PayloadType.LAB_REPLY, LAB_KEY, DOMAIN_SUBMIT), TRUSTED)
    except WireError as exc:
        _check_code(exc)
        return
    for item in (*reply.resends, reply.submission):
        _signed_submission_envelope(item)


def _signed_submission_envelope(item: bytes) -> None:
    try:
        body, _ = open_envelope(item, TRUSTED, DOMAIN_SUBMIT, PayloadType.SUBMISSION)
        sub = wire.decode_submission(body)
    except WireError as exc:
        _check_code(exc)
        return
    _judge(sub)


def _signed_submission(data: bytes) -> None:
    """Fuzzed submission payload bytes, sealed with the registered key: past the signature check."""
    _signed_submission_envelope(seal(data, PayloadType.SUBMISSION, LAB_KEY, DOMAIN_SUBMIT))


TARGETS = [*(lambda data, n=name: _decode(n, data) for name in CODECS), _open_raw, _signed_lab_reply,
           _signed_submission]
TARGET_NAMES = [*CODECS, "open_raw", "signed_lab_reply", "signed_submission"]


def test_one_input(data: bytes) -> None:
    if not data:
        return
    TARGETS[data[0] % len(TARGETS)](data[1:])


# ---- seeds ----------------------------------------------------------------------------------------


def _honest_submission() -> Submission:
    trajectories = []
    for prompt in PLAN.prompts:
        problem = TASK.problem(prompt.prompt_id)
        for i, text in enumerate((problem.answer, problem.answer + "1")):
            trajectories.append(Trajectory(
                f"{prompt.prompt_id}/{i}", prompt.prompt_id, "lab", 0, prompt.messages, text,
                TASK.verify(problem, text).reward, -0.5 * len(text), len(text), "stop"))
    report = StepReport("lab", 0, {"loss": 0.25, "time_rollout_s": 0.5}, 0.5)
    return Submission("fuzz", "lab", 0, tuple(trajectories), report, nonce="ab" * 16, created_at_ms=1234)


def seeds() -> dict[str, bytes]:
    """One valid input per target (the target byte first)."""
    sub = _honest_submission()
    sub_bytes = wire.encode_submission(sub)
    sealed_sub = seal(sub_bytes, PayloadType.SUBMISSION, LAB_KEY, DOMAIN_SUBMIT)
    receipt = wire.SubmissionReceipt("fuzz", 0, "lab", ("t/0",), (wire.Rejection("HACFED-E-SCHEMA", "bad", "t/1"),),
                                     3, "00" * 32, "ab" * 16)
    refusal = wire.SubmissionRefusal("fuzz", 0, "lab", "ab" * 16, "HACFED-E-RATE-LIMITED", "slow down", 1500)
    answer = seal_answer(receipt, COORDINATOR_KEY)
    caps = {"lab": 0.5, "other": 0.25}
    update = RoundUpdate("fuzz", 0, sub.trajectories, caps, PLAN, ("lab", "other"), HacpoConfig())
    by_target = {
        "envelope": sealed_sub,
        "submission": sub_bytes,
        "lab_reply": wire.encode_lab_reply(wire.LabReply(sealed_sub, (sealed_sub,))),
        "delivery": wire.encode_delivery(wire.Delivery((answer,), b"request")),
        "round_update": wire.encode_round_update(update),
        "round_plan": wire.encode_round_plan(PLAN),
        "receipt": wire.encode_receipt(receipt),
        "refusal": wire.encode_refusal(refusal),
        "error": wire.encode_error(wire.ErrorReply("HACFED-E-SCHEMA", "bad")),
        "step_report": wire.encode_step_report(sub.report),
        "trajectory": wire.encode_trajectory(sub.trajectories[0]),
        "trajectory_batch": wire.encode_trajectory_batch(sub.trajectories),
        "open_raw": seal_lab_reply(sealed_sub, (), LAB_KEY),
        "signed_lab_reply": wire.encode_lab_reply(wire.LabReply(sealed_sub, ())),
        "signed_submission": sub_bytes,
    }
    extra = {"open_raw#delivery": seal_delivery((answer,), b"", COORDINATOR_KEY),
             "open_raw#answer": seal_answer(refusal, COORDINATOR_KEY),
             "envelope#update": seal(wire.encode_round_update(update), PayloadType.ROUND_UPDATE, COORDINATOR_KEY,
                                     DOMAIN_UPDATE),
             "envelope#receipt": seal(wire.encode_receipt(receipt), PayloadType.RECEIPT, COORDINATOR_KEY,
                                      DOMAIN_RECEIPT)}
    out = {name: bytes([TARGET_NAMES.index(name)]) + data for name, data in by_target.items()}
    out.update({name: bytes([TARGET_NAMES.index(name.split("#")[0])]) + data for name, data in extra.items()})
    return out


def fill_corpus(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    if any(directory.iterdir()):
        return
    for name, data in seeds().items():
        (directory / f"seed-{name.replace('#', '-')}").write_bytes(data)


def main(argv: list[str]) -> None:
    for arg in argv[1:]:
        if not arg.startswith("-") and not Path(arg).is_file():  # a file: one input to replay (a crash)
            fill_corpus(Path(arg))
    for data in seeds().values():  # the seeds themselves must pass before anything is fuzzed
        test_one_input(data)
    atheris.Setup(argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
