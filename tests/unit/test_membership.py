"""Which Flower node speaks for which lab (security.md T5, S1): the signed hello, the SuperNode
binding, revocation by the next round, and ids that never reach a path or a console line raw.

The takeover through the real round loop is tests/unit/test_identity_takeover.py; this pins each
rule of `hacfed.server.membership` and the driver around it, one attack per test.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hacfed.clients.enrol import ensure_lab_keys
from hacfed.clients.service import make_key_offer
from hacfed.enrolment import parse_enrolment
from hacfed.envelope import DOMAIN_SUBMIT, EnvelopeError, generate_key, seal
from hacfed.hello import HELLO_PROOF_TYPE, check_challenge, hello_challenge, prove_identity
from hacfed.identity import printable
from hacfed.server.membership import Membership
from hacfed.server.node_auth import BINDINGS_FILE
from hacfed.server.registry import register, revoke
from tests.unit.test_coordinator_fakes import FakeClock
from tests.unit.test_server_driver import Federation


class Labs:
    """A registry with lab-a and lab-b (enrolled the documented way) and a bindings file."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.keys_dir = tmp_path / "keys"
        self.bindings = tmp_path / BINDINGS_FILE
        self.keys = {pid: ensure_lab_keys(tmp_path / pid, pid) for pid in ("lab-a", "lab-b")}
        self.entries = {pid: register(self.keys_dir, parse_enrolment(k.line)) for pid, k in self.keys.items()}
        self.bind({"lab-a": 7, "lab-b": 8})
        self.lines: list[str] = []

    def bind(self, nodes: dict[str, int]) -> None:
        data = {"nodes": {pid: {"node_id": n, "supernode_key": self.entries[pid].supernode_hash}
                          for pid, n in nodes.items()}, "pending": {}}
        self.bindings.write_text(json.dumps(data))

    def membership(self, *, node_auth: bool = True) -> Membership:
        return Membership(self.keys_dir, self.lines.append, bindings_path=self.bindings if node_auth else None)

    def proof(self, pid: str, challenge: bytes, signer: str | None = None) -> bytes:
        return prove_identity(challenge, pid, self.keys[signer or pid].private_key)


def test_the_node_bound_to_a_labs_supernode_key_with_its_signed_hello_is_that_lab(tmp_path: Path) -> None:
    labs = Labs(tmp_path)
    challenge = hello_challenge("run", 7)
    assert labs.membership().identify(7, "lab-a", labs.proof("lab-a", challenge), challenge) is None
    assert labs.membership().admit({7: "lab-a", 8: "lab-b"}) == {"lab-a", "lab-b"}


def test_another_registered_labs_node_cannot_be_lab_a_even_with_lab_as_signature(tmp_path: Path) -> None:
    """lab-a's signing key alone (say, leaked) is not enough: Flower authenticated node 8 with
    lab-b's SuperNode key, so node 8 is not lab-a."""
    labs = Labs(tmp_path)
    challenge = hello_challenge("run", 8)
    reason = labs.membership().identify(8, "lab-a", labs.proof("lab-a", challenge), challenge)
    assert reason is not None and "HACFED-E-IDENTITY-MISMATCH" in reason
    assert labs.membership().admit({8: "lab-a"}) == set()


def test_a_hello_signed_by_another_lab_is_refused(tmp_path: Path) -> None:
    labs = Labs(tmp_path)
    challenge = hello_challenge("run", 7)
    reason = labs.membership().identify(7, "lab-a", labs.proof("lab-a", challenge, signer="lab-b"), challenge)
    assert reason is not None and "not signed with the registered key of lab-a" in reason


def test_a_replayed_hello_proof_is_refused(tmp_path: Path) -> None:
    labs = Labs(tmp_path)
    old = hello_challenge("run", 7)
    proof = labs.proof("lab-a", old)
    assert labs.membership().identify(7, "lab-a", proof, hello_challenge("run", 7)) is not None


def test_a_hello_proof_in_another_domain_is_refused(tmp_path: Path) -> None:
    labs = Labs(tmp_path)
    challenge = hello_challenge("run", 7)
    forged = seal(challenge + b"\x00lab-a", HELLO_PROOF_TYPE, labs.keys["lab-a"].private_key, DOMAIN_SUBMIT)
    assert labs.membership().identify(7, "lab-a", forged, challenge) is not None


def test_a_lab_whose_supernode_key_is_not_bound_yet_is_not_admitted(tmp_path: Path) -> None:
    labs = Labs(tmp_path)
    labs.bind({"lab-b": 8})
    challenge = hello_challenge("run", 7)
    reason = labs.membership().identify(7, "lab-a", labs.proof("lab-a", challenge), challenge)
    assert reason is not None and "not registered with the SuperLink" in reason


def test_without_supernode_auth_the_signed_hello_alone_decides(tmp_path: Path) -> None:
    labs = Labs(tmp_path)
    challenge = hello_challenge("run", 99)
    membership = labs.membership(node_auth=False)  # plaintext development deployments
    assert membership.identify(99, "lab-a", labs.proof("lab-a", challenge), challenge) is None
    assert membership.identify(99, "lab-a", labs.proof("lab-a", challenge, "lab-b"), challenge) is not None


def test_revocation_is_seen_without_a_restart(tmp_path: Path) -> None:
    labs = Labs(tmp_path)
    membership = labs.membership()
    assert membership.admit({7: "lab-a", 8: "lab-b"}) == {"lab-a", "lab-b"}
    revoke(labs.keys_dir, "lab-b")
    assert membership.admit({7: "lab-a", 8: "lab-b"}) == {"lab-a"}  # the next round's check
    assert "lab-b" not in membership.registry.owners.values()  # its envelopes no longer open


def test_the_participant_signs_only_hello_challenges() -> None:
    with pytest.raises(EnvelopeError, match="not a hello challenge"):
        check_challenge(b"hacfed/v1/submit\x00anything")
    with pytest.raises(EnvelopeError, match="not a hello challenge"):
        prove_identity(b"x" * 600, "lab-a", generate_key())


# ---- ids: never a path, never a raw console line ---------------------------------------------------


def test_tofu_hello_with_a_path_id_writes_nothing_outside_the_keys_dir(tmp_path: Path) -> None:
    """reproduction 6: with trust on first use, `../../escaped-tofu` wrote a key outside the keys dir."""
    fed = Federation(tmp_path, FakeClock(), trust_on_first_use=True, expected_participants=1)
    attacker = fed.add(1, "lab-z", register=False)  # its node will claim a path as its id
    evil = "../../escaped-tofu"
    for _ in range(3):
        payloads = fed.driver.next_round({1: evil}) or {}  # even if the loop had mapped it
        for node, payload in payloads.items():
            fed.driver.on_replies([(node, attacker.handle(payload))])
        fed.driver.close_round()
    assert not fed.driver.identify(1, evil, make_key_offer(generate_key()))
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.pub")
                  if "keys" not in p.parts and "lab-z" not in p.parts) == ["server/coordinator.pub"]
    assert list(fed.keys_dir.iterdir()) == []


@pytest.mark.parametrize("pid", ["lab a", "../../x", "LAB-A"])
def test_tofu_key_offer_for_an_invalid_id_is_refused(tmp_path: Path, pid: str) -> None:
    membership = Membership(tmp_path / "keys", print, trust_on_first_use=True)
    with pytest.raises(ValueError, match="participant id must be"):
        membership.accept_offer(pid, make_key_offer(generate_key()))
    assert list((tmp_path / "keys").iterdir()) == []


def test_a_hello_id_with_a_newline_cannot_forge_console_lines(tmp_path: Path) -> None:
    """reproduction 7: a hello id was printed raw, so "x\\nround 5 closed (quorum)" forged a line."""
    fed = Federation(tmp_path, FakeClock(), expected_participants=1)
    fed.add(1, "lab-a")
    forged = "evil\nround 5 closed (quorum); contributors ['lab-a']\x1b[2K\u202e"
    fed.driver.hello(2)
    assert not fed.driver.identify(2, forged, b"junk")
    fed.driver.next_round({1: "lab-a", 2: forged})
    fed.driver.on_error(1, "HACFED-E-X: a\nround 6 closed (quorum)")  # a hostile relay's error text
    assert fed.lines and all(line.isprintable() for line in fed.lines)
    assert not any(line.startswith("round 5") or line.startswith("round 6") for line in fed.lines)
    refused = [line for line in fed.lines if line.startswith("REFUSED node 2 as participant")]
    assert refused == [f"REFUSED node 2 as participant {printable(forged)}: not a valid participant id "
                       f"(HACFED-E-SCHEMA)"]
    assert "\\n" in refused[0]


def test_printable_shows_valid_ids_as_they_are_and_escapes_the_rest() -> None:
    assert printable("lab-a_1") == "lab-a_1"
    assert printable("a\nb") == "'a\\nb'"
    assert printable("\u202eevil") == "'\\u202eevil'"
    assert printable("x" * 100).endswith("...") and len(printable("x" * 100)) < 80
    assert printable(None) == "'None'"



def test_a_node_whose_id_is_not_registered_is_told_so_with_its_next_hello(tmp_path: Path) -> None:
    fed = Federation(tmp_path, FakeClock(), expected_participants=1)
    stranger = fed.add(2, "lab-x", register=False)
    notices: list[str] = []
    stranger._on_notice = notices.append
    fed.identified()  # refused: lab-x is not registered
    assert notices == [] and 2 not in fed.mapped
    fed.identified()  # the loop asks again later: this hello carries the notice
    assert 2 not in fed.mapped and len(notices) == 1
    assert "refused this lab (HACFED-E-UNKNOWN-PARTICIPANT)" in notices[0] and "hacfed-server register" in notices[0]
    fed.identified()  # at most every NOTICE_INTERVAL_S
    assert len(notices) == 1
