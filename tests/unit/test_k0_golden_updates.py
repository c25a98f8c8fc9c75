"""At max_staleness 0 every update a lab receives is byte for byte the recorded one.

The fixture `tests/fixtures/k0_updates_golden.json` holds the sha256 of every update each scripted lab
was sent in a small deterministic federation (four labs, one of them cheating, one peer per prompt so
that the shares differ, three rounds and the final update), over each path a K = 0 update takes:

- `inprocess`: the in-process transport (`hacfed sim`, tests): the canonical encoding of each update;
- `paced`: the same federation on the simulated clock (a lab four times slower);
- `flower`: the Flower driver's sealed updates (spliced from shared blocks, signed with a fixed key).

Regenerate it (only when an update is meant to change) with
`python -m tests.unit.test_k0_golden_updates > tests/fixtures/k0_updates_golden.json`.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from hacfed.envelope import DOMAIN_UPDATE, open_envelope
from hacfed.keys import key_id
from hacfed.server.coordinator.transport import run_paced, run_rounds
from hacfed.server.round_updates import SealedUpdates
from hacfed.wire import PayloadType, decode_round_update, encode_round_update
from tests.unit.test_coordinator_fakes import FakeClock, ScriptedEndpoint, make_coordinator

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "k0_updates_golden.json"
LABS = ("lab-a", "lab-b", "lab-c", "lab-d")
SETTINGS = dict(rounds=3, prompts_per_round=3, expected_participants=4, pool_peers_per_prompt=1, max_strikes=5)
KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _endpoints() -> list[ScriptedEndpoint]:
    return [ScriptedEndpoint(pid, "cheat" if pid == "lab-c" else "honest") for pid in LABS]


def _digests(endpoints: list[ScriptedEndpoint]) -> dict[str, list[str]]:
    return {ep.participant_id: [_sha(encode_round_update(u)) for u in ep.updates] for ep in endpoints}


def inprocess(state: Path) -> dict[str, list[str]]:
    clock = FakeClock()
    endpoints = _endpoints()
    run_rounds(make_coordinator(state, clock, **SETTINGS), endpoints, sleep=clock.sleep)
    return _digests(endpoints)


def paced(state: Path) -> dict[str, list[str]]:
    clock = FakeClock()
    endpoints = _endpoints()
    run_paced(make_coordinator(state, clock, **SETTINGS), endpoints, {"lab-d": 4.0},
              lambda lab, update, sub: 1.0 + len(update.pool), sleep=clock.sleep)
    return _digests(endpoints)


def flower(state: Path) -> dict[str, list[str]]:
    """The synchronous Flower driver's sealed updates, round by round, each lab's opened and answered
    as a scripted lab answers it."""
    clock = FakeClock()
    coordinator = make_coordinator(state, clock, **SETTINGS)
    updates = SealedUpdates(coordinator.cfg, coordinator, KEY, console=lambda line: None)
    endpoints = _endpoints()
    for pid in LABS:
        coordinator.register(pid)
    out: dict[str, list[str]] = {pid: [] for pid in LABS}
    trusted = {key_id(KEY.public_key()): KEY.public_key()}
    for round_id in range(coordinator.cfg.rounds + 1):
        if round_id < coordinator.cfg.rounds:
            coordinator.open_round(round_id)
        sealed = updates.for_round(round_id)
        for ep in endpoints:
            envelope = b"".join(sealed(ep.participant_id))
            out[ep.participant_id].append(_sha(envelope))
            payload, _ = open_envelope(envelope, trusted, DOMAIN_UPDATE, PayloadType.ROUND_UPDATE)
            submission = ep.exchange(decode_round_update(payload))
            if round_id < coordinator.cfg.rounds:
                coordinator.submit(submission, sender=ep.participant_id)
            else:
                coordinator.record_final_report(submission, sender=ep.participant_id)
        if round_id < coordinator.cfg.rounds:
            coordinator.close_round(coordinator.poll())
    return out


def record() -> dict[str, dict[str, list[str]]]:
    out = {}
    for name, run in (("inprocess", inprocess), ("paced", paced), ("flower", flower)):
        with tempfile.TemporaryDirectory() as state:
            out[name] = run(Path(state))
    return out


GOLDEN = json.loads(FIXTURE.read_text())


def test_inprocess_updates_are_the_recorded_bytes(tmp_path):
    assert inprocess(tmp_path) == GOLDEN["inprocess"]


def test_paced_updates_at_k0_are_the_recorded_bytes(tmp_path):
    assert paced(tmp_path) == GOLDEN["paced"]


def test_flower_sealed_updates_are_the_recorded_bytes(tmp_path):
    assert flower(tmp_path) == GOLDEN["flower"]


def test_the_recorded_run_has_distinct_shares():
    """The fixture would not pin the share selection if every lab got the same update."""
    for path in GOLDEN.values():
        assert all(len(updates) == SETTINGS["rounds"] + 1 for updates in path.values())
        assert len({updates[1] for updates in path.values()}) == len(LABS)


if __name__ == "__main__":
    json.dump(record(), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
