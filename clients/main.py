"""`hacfed-client --model MODEL --server HOST:PORT`: a lab joins a federation.

    hacfed-client keys --state-dir state/lab-a --participant-id lab-a   # once: keys + enrolment line
    hacfed-client --model tiny-llama --server coordinator.example:9092 --participant-id lab-a \\
        --state-dir state/lab-a --coordinator-key coordinator.pub --tls-ca ca.pem

Loads the model (a preset such as tiny-llama / tiny-gpt2 / tiny-qwen2 / smollm2, a local Hugging Face
directory or a cached hub id) and keeps it resident, serves it to its Flower SuperNode's relay on
a private Unix socket, and trains with HACPO on every round's verified pool. On first start it creates the lab's
keys (STATE/participant.key, STATE/supernode.key) and STATE/enrolment.txt, and prints the enrolment
line the coordinator's operator registers (`hacfed-server register`). It exits 0 when the
coordinator closes the run (unless --stay). Restarted with the same command, it resumes from its
checkpoint. `--insecure` (plaintext) is for a coordinator on 127.0.0.1 only. Bad settings are
refused before any file is created.

After the coordinator's operator purged a participant (`hacfed-server purge`), the same command with
`replay --exclude X --from-round R` in front (hacfed-client stopped) rolls the lab back and trains
again without X's samples (hacfed.clients.replay).
"""

from __future__ import annotations

import argparse
import signal
import sys

from hacfed.config_values import OneLineArgumentParser, describe_os_error


def build_parser() -> argparse.ArgumentParser:
    # Flags default to None so the --config file can fill them; the effective defaults are in the help
    # (ClientConfig and its ParticipantConfig; tests/unit/test_client_config.py keeps the two in step).
    parser = OneLineArgumentParser(
        prog="hacfed-client", description=__doc__.split("\n\n")[0],
        epilog="Settings precedence: --config file < flags < --task items. See deploy/participant.toml. The five "
               "settings marked 'required' must come from a flag or the [participant] table of --config. "
               "`hacfed-client keys --help`: the lab's keys and its enrolment for the coordinator.",
    )
    parser.add_argument("--config", metavar="FILE", help="TOML with a [participant] table (these options, with "
                        "underscores) and a [task] table; flags override it (default: none)")
    parser.add_argument("--model", help="required: a preset (tiny-llama, tiny-gpt2, tiny-qwen2; `hacfed models list`), "
                        "smollm2, a local Hugging Face model directory, or a hub id already in the local Hugging Face "
                        "cache (nothing is downloaded)")
    parser.add_argument("--server", metavar="HOST:PORT", help="required: the coordinator's Fleet API address "
                        "(what hacfed-server prints as 'ready: Fleet API on ...')")
    parser.add_argument("--participant-id", metavar="ID", help="required: this lab's id (1-63 characters of a-z, "
                        "0-9, - and _, starting with a letter or digit), as registered with the coordinator")
    parser.add_argument("--state-dir", metavar="DIR", help="required: this lab's keys, checkpoints, reply cache and "
                        "logs; run the same command again to resume from it")
    parser.add_argument("--coordinator-key", metavar="FILE", help="required: the coordinator's public key "
                        "(its STATE/coordinator.pub); only updates signed by it are accepted")
    parser.add_argument("--insecure", action="store_true", default=None,
                        help="plaintext, no SuperNode authentication: development only, for a coordinator on "
                             "127.0.0.1 (default: off; then --tls-ca is required)")
    parser.add_argument("--tls-ca", metavar="FILE", help="CA certificate (PEM) that signed the coordinator's TLS "
                        "certificate (default: none; required unless --insecure)")
    parser.add_argument("--task", action="append", default=[], metavar="KEY=VALUE", dest="task_sets",
                        help="one task setting; the task must equal the coordinator's [task] (default: kind=arithmetic "
                             "digits=2 operators=+), e.g. --task digits=3 (repeatable)")
    parser.add_argument("--finetune", choices=("auto", "full", "lora"), help="full fine-tuning, LoRA adapters "
                        "only, or auto: LoRA with activation checkpointing above 300M parameters, full below "
                        "(default: auto)")
    parser.add_argument("--device", help="torch device for the model, e.g. cpu or cuda:0 (default: cpu)")
    parser.add_argument("--rollout-backend", choices=("hf", "vllm"), help="rollout engine: transformers' generate, "
                        "or vLLM on a GPU (default: hf)")
    parser.add_argument("--lr", type=float, dest="learning_rate", help="learning rate of the local HACPO updates "
                        "(default: 5e-05)")
    parser.add_argument("--lora-rank", type=int, help="LoRA rank with --finetune lora (default: 8)")
    parser.add_argument("--eval-problems", type=int, help="held-out problems per greedy evaluation (default: 200)")
    parser.add_argument("--eval-split", choices=("test", "validation"), help="what the greedy evaluation scores: "
                        "the task's test split, or its validation split, for choosing this lab's settings without "
                        "the test problems (a plugin task's num_validation) (default: test)")
    parser.add_argument("--minibatch-size", type=int, help="samples per optimizer step (default: prompts x G / 2, "
                        "half of one source's samples: the paper's two updates per source)")
    parser.add_argument("--seed", type=int, help="local seed for sampling and initialisation (default: 0)")
    parser.add_argument("--nproc", type=int, help="processes that train this lab's model data-parallel "
                        "(torch.distributed DDP: gloo on CPU, NCCL on CUDA, one device per process); this process is "
                        "rank 0 and alone talks to the coordinator (default: 1)")
    parser.add_argument("--stay", action="store_true", default=None,
                        help="keep serving after the coordinator closed the run (default: off: exit 0 once the "
                             "coordinator has recorded this lab's final report)")
    parser.add_argument("--tensorboard", metavar="DIR", help="also write every step's metrics (the keys of "
                        "STATE/metrics.jsonl) as TensorBoard event files here; needs the tensorboard package "
                        "(default: none)")
    parser.add_argument("--wandb", metavar="PROJECT", help="also log every step's metrics to this Weights & Biases "
                        "project; needs the wandb package (not installed by hacfed); WANDB_MODE=offline etc. are "
                        "honoured (default: none)")
    parser.add_argument("--slowdown", type=float, metavar="FACTOR",
                        help="stretch every step to FACTOR times its rollout and training time by sleeping before "
                             "the reply, to test labs of different speeds, docs/staleness.md (default: 1, no slowdown)")
    parser.add_argument("--exit-when-done", action="store_true", help=argparse.SUPPRESS)  # the default now; kept
    # so older scripts keep working
    return parser


NAMES = ("model", "server", "participant_id", "state_dir", "coordinator_key", "insecure", "tls_ca", "finetune",
         "device", "rollout_backend", "learning_rate", "lora_rank", "eval_problems", "eval_split", "minibatch_size",
         "seed", "stay", "tensorboard", "wandb", "nproc", "slowdown")
REPLAY_SERVER = "127.0.0.1:1"  # replay talks to nobody: --server may be left out (a valid placeholder address)


def replay_main(argv: list[str]) -> int:
    """`hacfed-client replay [the lab's usual flags] --exclude X --from-round R` (hacfed.clients.replay)."""
    parser = build_parser()
    parser.prog = "hacfed-client replay"
    parser.description = ("After `hacfed-server purge --participant X --from-round R`: roll this lab back to its "
                          "last checkpoint without X's samples and train again on the pools since, without them.")
    parser.add_argument("--exclude", required=True, metavar="ID", help="the purged participant")
    parser.add_argument("--from-round", required=True, type=int, metavar="R", help="the purge's first round")
    args = parser.parse_args(argv)
    from hacfed.clients.config import load_client_config

    flags = {name: getattr(args, name) for name in NAMES}
    flags["server"] = flags["server"] or REPLAY_SERVER
    try:
        cfg = load_client_config(args.config, flags, args.task_sets)
        from hacfed.clients.replay import run_replay

        return run_replay(cfg, args.exclude, args.from_round, lambda line: print(f"hacfed-client: {line}", flush=True))
    except ValueError as exc:
        print(f"hacfed-client: error: {exc}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    from hacfed.progress import bars_only_on_a_terminal

    bars_only_on_a_terminal()  # before transformers or huggingface_hub are imported
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["keys"]:  # `hacfed-client keys ...`: create / show this lab's keys and enrolment
        from hacfed.clients.enrol import main as keys_main

        return keys_main(argv[1:])
    if argv[:1] == ["replay"]:
        return replay_main(argv[1:])
    args = build_parser().parse_args(argv)
    from hacfed.clients.config import check_server_name, load_client_config

    try:
        cfg = load_client_config(args.config, {name: getattr(args, name) for name in NAMES}, args.task_sets)
        check_server_name(cfg.server)
        from hacfed.clients.finished import finished_run

        if not cfg.stay and (run_id := finished_run(cfg.state_dir)) is not None:
            print(f"hacfed-client: this lab already finished run {run_id} (the coordinator acknowledged its final "
                  f"report; the state dir {cfg.state_dir} belongs to that run): nothing to do. To join a new run, "
                  "use a fresh --state-dir", flush=True)
            return 0
        from hacfed.clients.runner import run_client

        # Ctrl-C must stop the children even when a shell started this job with SIGINT ignored.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        return run_client(cfg)
    except ValueError as exc:
        print(f"hacfed-client: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a read-only or full state directory, a missing file, ...
        print(f"hacfed-client: error: {describe_os_error(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before any child process was started
        print("hacfed-client: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
