"""`hacfed-server`: the coordinator of a federation, over Flower.

    hacfed-server --config deploy/coordinator.toml --set rounds=3 --set task.digits=3 \\
        --listen 0.0.0.0:9092 --tls-cert certs/server.pem --tls-key certs/server.key --tls-ca certs/ca.pem
    hacfed-server --config deploy/coordinator.toml --insecure --listen 127.0.0.1:9092   # development only
    hacfed-server certs init | register | revoke | labs ...   # onboarding (hacfed.server.onboarding)
    hacfed-server audit verify | purge ...                    # administration (hacfed.server.admin)

Starts a Flower SuperLink (gRPC Fleet API) and the hacfed app run, whose ServerApp drives the rounds
through the coordinator's journal in the state dir; prints who joined, each round's per-participant
reward, accuracy, rejections and time split; writes JSONL metrics; exits 0 when all rounds are done.
Killed and restarted with the same command, it resumes at the right round. Never imports torch.

Administrative commands (hacfed.server.admin): `hacfed-server audit verify --state-dir DIR` checks
the hash-chained audit log; `hacfed-server purge --state-dir DIR --participant X --from-round R`
withdraws a participant's samples and lists what each lab must replay.
"""

from __future__ import annotations

import argparse
import signal
import sys

from hacfed.config_values import OneLineArgumentParser, describe_os_error

ONBOARDING_COMMANDS = ("certs", "register", "revoke", "labs")
DEFAULT_LISTEN = "127.0.0.1:9092"  # = hacfed.server.config.DEFAULT_LISTEN (kept torch- and import-free here)


def build_parser() -> argparse.ArgumentParser:
    # Flags default to None so the config file can fill them; the effective defaults are in the help.
    parser = OneLineArgumentParser(
        prog="hacfed-server", description=__doc__.split("\n\n")[0],
        epilog="Settings precedence: config file < --set < the dedicated flags. See deploy/coordinator.toml for "
               "every setting and its default. Operator commands: hacfed-server certs|register|revoke|labs|audit|"
               "purge --help.",
    )
    parser.add_argument("--config", required=True, metavar="FILE",
                        help="required: TOML with the coordinator's settings (run_id, rounds, prompts_per_round, "
                             "group_size, expected_participants, min_participants, round_deadline_s, state_dir, "
                             "[task], [sampling], [hacpo]) and a [server] table for this process")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="sets",
                        help="override one setting of the file, e.g. rounds=3, group_size=4, task.digits=3, "
                             "sampling.max_new_tokens=8, hacpo.alpha=2.0, server.listen=127.0.0.1:0 (default: "
                             "none; repeatable)")
    parser.add_argument("--state-dir", metavar="DIR",
                        help="journal, SuperLink database, keys, logs and metrics; run the same command again to "
                             "resume from it (default: the file's state_dir)")
    parser.add_argument("--listen", metavar="HOST:PORT",
                        help="Fleet API address the labs connect to; port 0 lets the OS pick one, printed in the "
                             f"ready line (default: [server] listen, else {DEFAULT_LISTEN})")
    parser.add_argument("--insecure", action="store_true", default=None,
                        help="plaintext, no SuperNode authentication: development only, on a loopback --listen "
                             "address (default: [server] insecure, else off; then --tls-cert, --tls-key and --tls-ca "
                             "are required)")
    parser.add_argument("--tls-cert", metavar="FILE", help="server certificate (PEM) for the Fleet API, from "
                        "hacfed-server certs init (default: [server] tls_cert)")
    parser.add_argument("--tls-key", metavar="FILE", help="private key of --tls-cert (PEM) (default: [server] "
                        "tls_key)")
    parser.add_argument("--tls-ca", metavar="FILE", help="CA certificate (PEM) that signed --tls-cert (default: "
                        "[server] tls_ca)")
    parser.add_argument("--keys-dir", metavar="DIR",
                        help="the registry of labs, edited by hacfed-server register / revoke and re-read while an "
                             "unknown lab is connected (default: STATE/keys)")
    parser.add_argument("--metrics-out", metavar="FILE", help="JSONL metrics, one row per lab per round "
                        "(default: STATE/metrics.jsonl)")
    parser.add_argument("--trust-on-first-use", action="store_true", default=None,
                        help="DEVELOPMENT ONLY, needs --insecure: register the key of any unknown participant "
                             "(default: off)")
    parser.add_argument("--dashboard", metavar="HOST:PORT",
                        help="serve a read-only live dashboard (participants, round progress, reward / P-hat / "
                             "accuracy curves, rejections, time split) at http://HOST:PORT/; loopback only unless "
                             "--dashboard-public; from another machine use ssh -L 8080:127.0.0.1:8080 "
                             "coordinator-host (default: [server] dashboard, else off)")
    parser.add_argument("--dashboard-public", action="store_true", default=None,
                        help="allow --dashboard on a non-loopback address: anyone who can reach it sees the page, "
                             "which has no authentication (default: off)")
    return parser


def main(argv: list[str] | None = None) -> int:
    from hacfed.progress import bars_only_on_a_terminal

    bars_only_on_a_terminal()  # before transformers or huggingface_hub are imported
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("audit", "purge"):  # administrative commands (hacfed.server.admin)
        from hacfed.server.admin import main as admin_main

        return admin_main(argv)
    if argv and argv[0] in ONBOARDING_COMMANDS:  # certs / register / revoke / labs (hacfed.server.onboarding)
        from hacfed.server.onboarding import main as onboarding_main

        return onboarding_main(argv)
    args = build_parser().parse_args(argv)
    from hacfed.server.config import load_server_config  # torch-free, like everything this process imports

    flags = {"state_dir": args.state_dir, "listen": args.listen, "insecure": args.insecure, "tls_cert": args.tls_cert,
             "tls_key": args.tls_key, "tls_ca": args.tls_ca, "keys_dir": args.keys_dir,
             "metrics_out": args.metrics_out, "trust_on_first_use": args.trust_on_first_use,
             "dashboard": args.dashboard, "dashboard_public": args.dashboard_public}
    try:
        cfg = load_server_config(args.config, args.sets, flags)
        from hacfed.server.runner import run_server

        # Ctrl-C must stop the children even when a shell started this job with SIGINT ignored.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        return run_server(cfg)
    except ValueError as exc:
        print(f"hacfed-server: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a read-only or full state directory, a missing file, ...
        print(f"hacfed-server: error: {describe_os_error(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before any child process was started
        print("hacfed-server: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
