"""hacfed-server's administrative commands, run by the coordinator's operator beside (or instead of)
the server itself; each reads the state directory and never starts a federation.

    hacfed-server audit verify --state-dir state/coordinator [--coordinator-key coordinator.pub]
    hacfed-server purge --state-dir state/coordinator --participant lab-x --from-round 4 [--dry-run]

`audit verify` checks the hash chain of STATE/audit.log (hacfed.server.coordinator.audit) and names
the first line that was edited, deleted, inserted or torn, and checks its head (the line count and
last hash, signed with the coordinator's key) against STATE/coordinator.pub or the copy given with
--coordinator-key (the one the labs hold: an attacker who can write the state dir can replace the
.pub there too), and that the log still holds the last line the journal recorded (its number and
hash, written in the transaction of the decision: `audit_tail`); exit 0 when intact, 1 when not.

`purge` (security.md "Nothing lost", R11) withdraws participant X's accepted samples of rounds >= R from every
pool published from now on, quarantines X (it gets no more updates and its submissions are refused),
journals and audits the purge, and tells the operator what each lab must do. A lab trains on the pool
of round k when it answers the update of round k + 1, so its checkpoint of round R (taken after it
rolled out plan R, before it trained on pool R) is the last one without X's influence; each lab that
trained on an affected pool runs `hacfed-client replay --exclude X --from-round R` to restore that
checkpoint and retrain on the pools it received, without X's samples. Samples that other labs
produced with policies that had learned from X stay in the pools: a purge removes X's data, not its
second-hand influence. Safe to run while hacfed-server runs (the journal and the audit log are
locked per write).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from hacfed.config_values import OneLineArgumentParser, describe_os_error
from hacfed.envelope import load_public_key
from hacfed.server.coordinator.audit import AuditLog, verify_audit_log
from hacfed.server.coordinator.audit_tail import read_tail
from hacfed.server.coordinator.errors import AuditError, JournalError
from hacfed.server.coordinator.journal import Journal
from hacfed.server.coordinator.validation import is_short_id

COMMANDS = ("audit", "purge")
JOURNAL_FILE = "journal.sqlite"  # CoordinatorConfig.journal_path / audit_path, without needing the config
AUDIT_FILE = "audit.log"
MAX_ROUND = 2**63 - 1


def say(text: str) -> None:
    print(f"hacfed-server: {text}", flush=True)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(prog="hacfed-server", description="hacfed-server's administrative commands")
    commands = parser.add_subparsers(dest="command", required=True)
    audit = commands.add_parser("audit", help="the hash-chained audit log")
    audit_commands = audit.add_subparsers(dest="audit_command", required=True)
    verify = audit_commands.add_parser("verify", help="check every line of STATE/audit.log; exit 1 naming the "
                                                      "first bad line")
    verify.add_argument("--state-dir", required=True, metavar="DIR", help="the coordinator's state directory")
    verify.add_argument("--coordinator-key", metavar="FILE", help="the coordinator's public key that signed the "
                        "log's head, e.g. the copy the labs were given (default: STATE/coordinator.pub)")
    purge = commands.add_parser("purge", help="withdraw a participant's samples from round R on and tell each lab "
                                              "how to replay without them")
    purge.add_argument("--state-dir", required=True, metavar="DIR", help="the coordinator's state directory")
    purge.add_argument("--participant", required=True, metavar="ID", help="the participant to purge")
    purge.add_argument("--from-round", required=True, type=_round_number, metavar="R",
                       help="first round to purge (>= 0)")
    purge.add_argument("--dry-run", action="store_true", help="list what would change, change nothing")
    return parser


def _round_number(text: str) -> int:
    """A round id the journal can hold (SQLite INTEGER: at most 2**63 - 1)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a round number, got {text!r:.40}") from None
    if not 0 <= value <= MAX_ROUND:
        raise argparse.ArgumentTypeError(f"must be in 0..{MAX_ROUND}, got {text:.40}")
    return value


def audit_verify(state_dir: Path, coordinator_key: str | None) -> int:
    path = state_dir / AUDIT_FILE
    public_key = None if coordinator_key is None else load_public_key(Path(coordinator_key).expanduser())
    journal = state_dir / JOURNAL_FILE
    tail = read_tail(journal) if journal.is_file() else None
    result = verify_audit_log(path, public_key, journal_tail=tail)
    if result.ok:
        witness = f"holds line {tail.lines} as the journal recorded it" if tail else \
            "not compared with the journal (it records no audit tail)"
        say(f"audit log {path}: {result.lines} lines, hash chain intact, head signed by the coordinator key "
            f"{result.signer}; {witness}")
        return 0
    say(f"audit log {path} FAILED verification: {result.problem}")
    return 1


def purge(state_dir: Path, participant: str, from_round: int, dry_run: bool) -> int:
    if not is_short_id(participant):
        raise ValueError(f"--participant must be a participant id, got {participant!r}")
    if not 0 <= from_round <= MAX_ROUND:
        raise ValueError(f"--from-round must be in 0..{MAX_ROUND}, got {from_round}")
    journal_path = state_dir / JOURNAL_FILE
    if not journal_path.is_file():
        raise ValueError(f"no journal at {journal_path}: is {state_dir} a coordinator's state directory?")
    with Journal(journal_path, audit=None if dry_run else AuditLog(state_dir / AUDIT_FILE)) as journal:
        if journal.participant(participant) is None:
            raise ValueError(f"{participant!r} never joined this run (known: "
                             f"{[p.participant_id for p in journal.participants()]})")
        rounds = journal.rounds_with_samples_of(participant, from_round)
        trained = journal.pools_trained_on()
        if dry_run:
            say(f"DRY RUN: would withdraw {participant}'s samples of rounds {rounds} and quarantine it")
        else:
            detail = f"samples of rounds >= {from_round} withdrawn from future pools; participant quarantined"
            withdrawn = journal.purge(participant, from_round, time.time(), detail)
            say(f"purged {participant} from round {from_round}: withdrew {sum(withdrawn.values())} samples "
                f"({withdrawn or 'none left'}) from the pools of rounds {rounds}; {participant} is quarantined")
    say(f"rounds whose pools held {participant}'s samples: {rounds or 'none'}")
    for lab, pools in trained.items():
        if lab == participant:
            continue
        affected = [k for k in pools if k in rounds]
        if affected:
            say(f"{lab} trained on affected pools {affected}: it must roll back and replay without {participant}:\n"
                f"    hacfed-client replay --state-dir <{lab}'s state dir> --model <its model> "
                f"--exclude {participant} --from-round {from_round}")
        else:
            say(f"{lab}: no affected pool in its reports; if it trained on the latest published pool, the same "
                f"replay command checks its own records and does nothing when there is nothing to replay")
    return 0


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        state_dir = Path(args.state_dir).expanduser().resolve()
        if args.command == "audit":
            return audit_verify(state_dir, args.coordinator_key)
        return purge(state_dir, args.participant, args.from_round, args.dry_run)
    except (ValueError, JournalError, AuditError) as exc:
        print(f"hacfed-server: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"hacfed-server: error: {describe_os_error(exc)}", file=sys.stderr)
        return 2
