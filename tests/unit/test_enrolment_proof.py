"""An enrolment proves possession of BOTH of the lab's keys (security.md T5): a lab cannot enrol
with another lab's public SuperNode key and so block that lab's own enrolment."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from hacfed.clients.enrol import ensure_lab_keys
from hacfed.enrolment import (
    ENROLMENT_FILE,
    ENROLMENT_TAG,
    ENROLMENT_TYPE,
    SUPERNODE_KEY,
    _payload,
    load_supernode_private_key,
    make_enrolment,
    parse_enrolment,
    supernode_public_text,
)
from hacfed.envelope import DOMAIN_ENROLMENT, generate_key, signed_message
from hacfed.keys import raw_public_bytes
from hacfed.server.main import main as server_main
from hacfed.server.registry import load_registry


def _squatting_line(lab_a_state: Path, node_proof: bool) -> str:
    """lab-z's enrolment with its own signing key (validly signed) and lab-a's PUBLIC SuperNode key;
    its SuperNode proof, when there is one, made with a key lab-z holds."""
    signing = generate_key()
    victim_node = load_supernode_private_key(lab_a_state / SUPERNODE_KEY).public_key()
    node_text = supernode_public_text(victim_node)
    payload = _payload("lab-z", signing.public_key(), node_text)
    sig = signing.sign(signed_message(DOMAIN_ENROLMENT, ENROLMENT_TYPE, payload))
    b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
    line = (f"{ENROLMENT_TAG} lab-z ed25519:{b64(raw_public_bytes(signing.public_key()))} "
            f"{node_text.replace(' ', ':', 1)} sig:{b64(sig)}")
    if node_proof:
        own = ensure_lab_keys(lab_a_state.parent / "lab-z", "lab-z").line  # lab-z's own SuperNode key signed this
        line += " " + own.split(" ")[-1]
    return line


@pytest.mark.parametrize("node_proof", [False, True], ids=["no-proof", "proof-by-another-key"])
def test_another_labs_supernode_key_cannot_be_enrolled(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                       node_proof: bool) -> None:
    lab_a = ensure_lab_keys(tmp_path / "lab-a", "lab-a")
    squat = tmp_path / "squat.txt"
    squat.write_text(_squatting_line(tmp_path / "lab-a", node_proof) + "\n")
    state = tmp_path / "server"
    assert server_main(["register", "--state-dir", str(state), str(squat)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert ("not signed by its SuperNode key" in err) if node_proof else ("no proof that its sender holds" in err)
    # lab-a's own enrolment is not blocked
    assert server_main(["register", "--state-dir", str(state), str(tmp_path / "lab-a" / ENROLMENT_FILE)]) == 0
    assert list(load_registry(state / "keys").entries) == ["lab-a"]
    assert parse_enrolment(lab_a.line).supernode_key.public_numbers() == lab_a.enrolment.supernode_key.public_numbers()


def test_the_enrolment_is_signed_by_both_keys_and_stable(tmp_path: Path) -> None:
    lab = ensure_lab_keys(tmp_path / "lab-b", "lab-b")
    fields = lab.line.split(" ")
    assert fields[0] == ENROLMENT_TAG and fields[4].startswith("sig:") and fields[5].startswith("nodesig:")
    assert ensure_lab_keys(tmp_path / "lab-b", "lab-b").line == lab.line  # deterministic: the file is not rewritten
    node_key = load_supernode_private_key(tmp_path / "lab-b" / SUPERNODE_KEY)
    assert make_enrolment("lab-b", lab.private_key, node_key) == lab.line
    edited = " ".join(fields[:5] + ["nodesig:" + base64.b64encode(b"\x30\x06\x02\x01\x01\x02\x01\x01").decode()])
    with pytest.raises(ValueError, match="not signed by its SuperNode key"):
        parse_enrolment(edited)
    with pytest.raises(ValueError, match="SuperNode's ECDSA private key"):
        make_enrolment("lab-b", lab.private_key, lab.enrolment.supernode_key)  # a public key proves nothing
