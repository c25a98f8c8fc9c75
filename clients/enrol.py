"""A lab's keys and enrolment: `hacfed-client keys` (also run by every hacfed-client start).

    hacfed-client keys --state-dir state/lab-b --participant-id lab-b          # print the enrolment
    hacfed-client keys --state-dir state/lab-b --participant-id lab-b --rotate # new keys (after a revocation)

Runs in hacfed-client's process. Creates, once, the lab's two key pairs in its state directory
(`participant.key`: Ed25519 signing key; `supernode.key`: Flower SuperNode authentication key; see
`hacfed.enrolment`), writes the one-line enrolment to `<state-dir>/enrolment.txt` and prints it
with the fingerprints. The lab sends that line to the coordinator's operator, who registers it
with `hacfed-server register` after comparing the fingerprints with the lab over another channel.
Private keys never leave the state directory.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from hacfed.config_values import OneLineArgumentParser
from hacfed.enrolment import (
    ENROLMENT_FILE,
    SUPERNODE_KEY,
    SUPERNODE_PUB,
    Enrolment,
    ensure_supernode_key,
    load_supernode_private_key,
    make_enrolment,
)
from hacfed.envelope import write_atomic
from hacfed.identity import check_participant_id
from hacfed.keys import ensure_key_pair

OLD_KEYS_DIR = "old-keys"


@dataclass(frozen=True)
class LabKeys:
    private_key: Ed25519PrivateKey
    enrolment: Enrolment
    line: str
    created: bool

    def describe(self) -> str:
        return self.enrolment.describe()


def ensure_lab_keys(state_dir: Path, participant_id: str) -> LabKeys:
    """The lab's keys (created on first use) and its enrolment line, also written to
    `<state-dir>/enrolment.txt`."""
    check_participant_id(participant_id)
    state_dir = Path(state_dir)
    signing = ensure_key_pair(state_dir, "participant")
    node = ensure_supernode_key(state_dir)
    private_key = signing.load()
    supernode_private = load_supernode_private_key(node.private)
    supernode_public = supernode_private.public_key()
    line = make_enrolment(participant_id, private_key, supernode_private)
    path = state_dir / ENROLMENT_FILE
    if not path.exists() or path.read_text(encoding="ascii", errors="replace").strip() != line:
        write_atomic(path, (line + "\n").encode("ascii"), 0o644)
    return LabKeys(private_key, Enrolment(participant_id, private_key.public_key(), supernode_public), line,
                   signing.created or node.created)


def rotate_lab_keys(state_dir: Path) -> Path | None:
    """Move the current keys to `<state-dir>/old-keys/<UTC time>/` (new ones are created next)."""
    state_dir = Path(state_dir)
    names = ["participant.key", "participant.pub", SUPERNODE_KEY, SUPERNODE_PUB, ENROLMENT_FILE]
    present = [state_dir / n for n in names if (state_dir / n).exists()]
    if not present:
        return None
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    target = state_dir / OLD_KEYS_DIR / stamp
    target.mkdir(parents=True)
    for path in present:
        os.replace(path, target / path.name)
    return target


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(prog="hacfed-client keys", description=__doc__.split("\n\n")[0])
    parser.add_argument("--state-dir", required=True, metavar="DIR",
                        help="the lab's state directory (the same as hacfed-client --state-dir)")
    parser.add_argument("--participant-id", required=True, metavar="ID", help="this lab's participant id")
    parser.add_argument("--rotate", action="store_true",
                        help="replace the keys with new ones (the old ones move to STATE/old-keys/); needed after "
                             "a revocation, since a revoked key is never registered again")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        state = Path(args.state_dir).expanduser().resolve()
        check_participant_id(args.participant_id, "--participant-id")
        if args.rotate and (old := rotate_lab_keys(state)) is not None:
            print(f"hacfed-client: moved the previous keys to {old}")
        keys = ensure_lab_keys(state, args.participant_id)
    except (ValueError, OSError) as exc:
        print(f"hacfed-client keys: error: {exc}", file=sys.stderr)
        return 2
    print(f"hacfed-client: {'created' if keys.created else 'existing'} keys in {state}: {keys.describe()}")
    print(f"hacfed-client: enrolment written to {state / ENROLMENT_FILE}; send it to the coordinator's operator, "
          f"who runs: hacfed-server register --state-dir STATE {ENROLMENT_FILE}")
    print(keys.line)
    return 0
