"""The operator's onboarding commands: certificates, registering and revoking labs (hacfed-server's process).

    hacfed-server certs init --dir certs --hosts coordinator.example     # federation CA + server certificate
    hacfed-server register --state-dir STATE lab-b-enrolment.txt         # admit a lab (after checking fingerprints)
    hacfed-server revoke --state-dir STATE lab-b                         # take it out, effective by the next round
    hacfed-server labs --state-dir STATE                                 # who is registered

`register` and `revoke` edit the registry (`<state-dir>/keys`, or --keys-dir; see
`hacfed.server.registry`) and record the change in the coordinator's hash-chained audit log
(`<state-dir>/audit.log`; a change the log cannot record is undone), so they work whether or not the
coordinator is running. A running hacfed-server picks a change up within seconds (it reads the
registry every second): it registers or unregisters the lab's SuperNode key with its SuperLink
(`hacfed.server.node_auth`), and its round driver re-reads the registry before every round and every
submission, so a revoked lab's next submission is refused, it is sent no more rounds (no more
pools), and rounds no longer wait for it (they close at quorum with the labs that are left).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from hacfed.certs import LOCAL_HOSTS, check_hosts, init_federation_certs
from hacfed.config_values import OneLineArgumentParser
from hacfed.enrolment import MAX_ENROLMENT_BYTES, check_enrolment_size, parse_enrolment, read_enrolment_file
from hacfed.server.audit import AuditError, AuditEvent, AuditLog
from hacfed.server.registry import describe, load_registry, register, revoke, unregister, unrevoke

AUDIT_FILE = "audit.log"  # CoordinatorConfig.audit_path, without needing the coordinator's config


def _keys_dir(args: argparse.Namespace) -> Path:
    if args.keys_dir:
        return Path(args.keys_dir).expanduser().resolve()
    return Path(args.state_dir).expanduser().resolve() / "keys"


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(prog="hacfed-server", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    certs = sub.add_parser("certs", help="the federation's TLS certificates")
    certs_sub = certs.add_subparsers(dest="certs_command", required=True)
    init = certs_sub.add_parser("init", help="create ca.pem/ca.key and server.pem/server.key (keys 0600)")
    init.add_argument("--dir", required=True, metavar="DIR", help="where the files go (ca.key stays with the operator)")
    init.add_argument("--hosts", default="", metavar="H1,H2",
                      help="names and addresses the labs connect to, comma-separated (127.0.0.1 and localhost are "
                           "always included)")
    init.add_argument("--days", type=int, default=365, help="validity in days (default 365)")
    init.add_argument("--overwrite", action="store_true", help="replace existing files (a new CA: every lab needs the "
                      "new ca.pem)")
    for name, text in (("register", "register a lab from its enrolment line (file, or - for stdin)"),
                       ("revoke", "revoke a lab: its keys move to KEYS/revoked/"),
                       ("labs", "list the registered labs and their key fingerprints")):
        cmd = sub.add_parser(name, help=text, description=text)
        cmd.add_argument("--state-dir", metavar="DIR", help="the coordinator's state dir: its registry is DIR/keys, "
                         "and registrations and revocations go to its audit log DIR/audit.log")
        cmd.add_argument("--keys-dir", metavar="DIR", help="the registry, when hacfed-server runs with --keys-dir")
        if name == "register":
            cmd.add_argument("enrolment", metavar="FILE", help="the lab's enrolment.txt (from hacfed-client keys)")
        elif name == "revoke":
            cmd.add_argument("participant_id", metavar="ID", help="the lab's participant id")
    return parser


def run(args: argparse.Namespace) -> int:
    if args.command == "certs":
        hosts = [h for h in args.hosts.split(",") if h.strip()]
        paths = init_federation_certs(Path(args.dir).expanduser(), hosts, days=args.days, overwrite=args.overwrite)
        print(f"hacfed-server: federation CA {paths.ca_cert} (give it to every lab: hacfed-client --tls-ca); its key "
              f"{paths.ca_key} stays here")
        print(f"hacfed-server: server certificate {paths.server_cert} and key {paths.server_key} for "
              f"{', '.join(check_hosts([*LOCAL_HOSTS, *hosts]))} (hacfed-server --tls-cert/--tls-key/--tls-ca)")
        return 0
    if not args.state_dir and not args.keys_dir:
        raise ValueError("pass --state-dir (the coordinator's state dir) or --keys-dir")
    keys_dir = _keys_dir(args)
    if args.command == "register":
        text = (check_enrolment_size(sys.stdin.buffer.read(MAX_ENROLMENT_BYTES + 1), "standard input")
                if args.enrolment == "-" else read_enrolment_file(Path(args.enrolment)))
        enrolment = parse_enrolment(text)
        keys_dir.mkdir(parents=True, exist_ok=True)
        new = enrolment.participant_id not in load_registry(keys_dir).entries
        entry = register(keys_dir, enrolment)
        if new:
            _audit(args, AuditEvent("register", participant=entry.participant_id, detail=describe(entry)),
                   undo=lambda: unregister(keys_dir, entry))
        print(f"hacfed-server: registered {describe(entry)}")
        print("hacfed-server: compare these fingerprints with the lab (its hacfed-client keys output) over another "
              "channel; a running coordinator admits it within seconds")
        return 0
    if args.command == "revoke":
        folder = revoke(keys_dir, args.participant_id)
        _audit(args, AuditEvent("revoke", participant=args.participant_id, detail=f"keys moved to {folder.name}"),
               undo=lambda: unrevoke(keys_dir, args.participant_id, folder))
        print(f"hacfed-server: revoked {args.participant_id} (keys moved to {folder}); a running coordinator refuses "
              f"its submissions from now on, sends it no more rounds and unregisters its SuperNode within seconds")
        return 0
    registry = load_registry(keys_dir)
    for entry in registry.entries.values():
        print(describe(entry))
    for problem in registry.problems:
        print(f"problem: {problem}")
    if not registry.entries:
        print(f"no lab registered in {keys_dir}")
    return 0


def _audit(args: argparse.Namespace, event: AuditEvent, undo: Callable[[], None]) -> None:
    """The coordinator's audit log records every registration and revocation (security.md S10).
    Fail closed: a change whose line cannot be written is undone."""
    if not args.state_dir:
        print("hacfed-server: note: no --state-dir, so this change is not in the coordinator's audit log")
        return
    try:
        AuditLog(Path(args.state_dir).expanduser().resolve() / AUDIT_FILE).append(event)
    except AuditError as exc:
        undo()
        raise ValueError(f"the audit log could not record the {event.kind} of {event.participant}, so it was undone: "
                         f"{exc}") from None


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except ValueError as exc:
        print(f"hacfed-server {args.command}: error: {exc}", file=sys.stderr)
        return 2
