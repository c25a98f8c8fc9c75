"""`hacfed sim`'s command line: its options, and the run they describe (`hacfed.tools.sim`).

    hacfed sim --agents tiny-llama,tiny-gpt2 --mode xhacpo --rounds 30 --seed 0 --metrics-out runs/sim.jsonl
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from hacfed.messages import ANSWER_KEYS, PEER_CHOICES
from hacfed.tools import sim
from hacfed.tools.cli_help import HelpFormatter
from hacfed.tools.modes import RECOMMENDED, modes_help
from hacfed.tools.sim import (
    DEFAULT_LR,
    RUN_SIZE_DEFAULTS,
    SIM_MODES,
    TASK_RUN_SIZES,
    TASKS,
    SimConfig,
    participant_ids,
    run_sim,
    summary_table,
)
from hacfed.tools.sim_paced import add_pacing_arguments, parse_lab_speeds, simulated_end

HOSTILE_HELP = """hostile agents (--agents A,B,hostile:KIND; docs/experiments.md, hacfed.tools.hostile):
  hostile:copy-gold       submits the task's reference solution for every sample
  hostile:canary:TEXT     reference solutions with TEXT in each derivation, answers still right (a task
                          with a derivation: chain, add2-words, gsm8k); rows then carry eval_canary_rate, the
                          fraction of an honest agent's greedy and sampled held-out answers containing TEXT
  hostile:lie-logprob[:M] model M (default: the first honest agent's) trains as an honest lab but claims the source
                          log-probs that give its samples the most weight in the honest learners' updates
  hostile:weak            right with probability 0.05, otherwise the reference with a wrong final answer
  Each goes through re-verification, P-hat, the pool choice and every mode's update as a real lab would."""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "sim", help="run a whole federation in one process (fast experiments)",
        description=sim.__doc__.split("\n\n")[0] + "\n\n" + sim.__doc__.split("\n\n")[2],
        epilog=modes_help() + "\n\ntasks:\n  add2   2-digit addition, 2-4 token answers (the quick smoke setting)\n"
               "  add2-words  the same sums in a sentence ('What is 37 + 58? Reply with only the number.'),\n"
               "         the last integer of the answer scored: for pretrained chat models (smollm2)\n"
               "  add2-story  one-step add/sub word problems ('Tom has 19 apples and buys 20 more. ...'), a\n"
               "         final 'Answer: N' scored: for pretrained chat models (smollm2)\n"
               "  chain  worked 3-term add/sub chains, 23-33 token answers (the testbed; agents chain-*)\n"
               "  chain-notations  the same chains, half of the prompts in words ('What is 47 plus 28 plus 15?')\n"
               "  gsm8k  GSM8K word problems (shipped copy), worked answers of hundreds of tokens, for pretrained\n"
               "         models"
               " (smollm2, a Hugging Face directory); smaller defaults: 2 prompts x 4 samples, 8 eval problems"
               "\n\n" + HOSTILE_HELP,
        formatter_class=HelpFormatter,
    )
    p.add_argument("--agents", default="tiny-llama,tiny-gpt2",
                   help="comma-separated model specs: zoo presets (`hacfed models list`), HF directories, and "
                        "hostile:KIND for a weak or hostile lab (see below)")
    p.add_argument("--mode", default=RECOMMENDED, choices=SIM_MODES, metavar="MODE", help="training mode (see below)")
    p.add_argument("--task", choices=tuple(TASKS), default="add2", help="the verifiable task (see below)")
    p.add_argument("--rounds", type=int, default=30, help="federation rounds (one training step each)")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompt plans and the sampling")
    p.add_argument("--prompts-per-round", type=int, default=None,
                   help="prompts in each round's plan (default 16; gsm8k 2)")
    p.add_argument("--group-size", type=int, default=None, help="responses per prompt per lab (G; default 8; gsm8k 4)")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="response budget (default: the task's, "
                        + ", ".join(f"{k} {v[1] or 'its own'}" for k, v in TASKS.items())
                        + "; gsm8k's is hacfed.tasks.math_data.GSM8K_MAX_NEW_TOKENS)")
    p.add_argument("--temperature", type=float, default=1.0,
                   help="rollout temperature T; every log-prob of the update is of the policy tempered at T, the "
                        "distribution sampled from (below 1, a small model's answers ramble less)")
    p.add_argument("--lr", type=float, default=DEFAULT_LR, help="AdamW learning rate of every agent")
    p.add_argument("--finetune", choices=("auto", "full", "lora"), default="auto",
                   help="full fine-tuning, a LoRA adapter, or auto: LoRA above 300M parameters (hacfed.models.memory)")
    p.add_argument("--digits", type=int, default=2, help="add2 and add2-words only: digits per operand")
    p.add_argument("--eval-every", type=int, default=5,
                   help="greedy held-out evaluation every K rounds (0: start and end only)")
    p.add_argument("--eval-problems", type=int, default=None,
                   help="held-out problems per evaluation (default 200; gsm8k 8)")
    p.add_argument("--eval-split", choices=("test", "validation"), default="test",
                   help="evaluate on the test split (reports) or the validation split (choosing settings)")
    p.add_argument("--eval-sampled", action="store_true",
                   help="also report sampled pass@1 (one T=1 sample per problem)")
    p.add_argument("--deny", action="append", default=[], metavar="TEXT",
                   help="a literal string (a known canary) every honest lab's text filter refuses, in peers' samples "
                        "and its own (repeatable; URLs and e-mail addresses are refused by default)")
    p.add_argument("--no-text-filter", action="store_true",
                   help="honest labs train on peers' text unchecked and send their own unchecked (the filter, on by "
                        "default, leaves out a peer's group that breaks the task's format or the deny-list: "
                        "train/skipped_filter)")
    p.add_argument("--no-eval-start", dest="eval_start", action="store_false",
                   help="skip the round-0 evaluation (the loaded model's, the same in every run that loads it)")
    p.add_argument("--hacpo", action="append", default=[], metavar="KEY=VALUE",
                   help="override one HacpoConfig setting, e.g. --hacpo alpha=2 (repeatable)")
    p.add_argument("--state-dir", default=None, help="coordinator journal directory (default: a temporary directory)")
    p.add_argument("--metrics-out", default=None, help="write the JSON Lines metrics (docs/experiments.md) here")
    p.add_argument("--tensorboard", metavar="DIR", default=None,
                   help="also write every row as TensorBoard scalars, one subdirectory per agent (needs tensorboard)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--nproc", type=int, default=1,
                   help="data-parallel processes for each agent's training and rollouts (torch.distributed: gloo on "
                        "CPU, NCCL on CUDA); 2 or more start child processes, each with OMP_NUM_THREADS=1 unless set")
    p.add_argument("--minibatch-size", type=int, default=None,
                   help="samples per optimizer step (default: prompts x G / 2, the paper's 2 updates per source, so "
                        "N labs make 2N updates per round; e.g. prompts x G x N / 4 keeps 4 whatever N)")
    _add_coordinator_arguments(p)
    add_pacing_arguments(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar (there is none off a terminal anyway)")



def _add_coordinator_arguments(p: Any) -> None:
    """The options that set the simulated coordinator's pool and answer keys, as its config keys do."""
    p.add_argument("--peers-per-prompt", type=int, default=None, metavar="K",
                   help="each agent is sent its own samples and, per prompt, the groups of at most K other agents, "
                        "as a coordinator's pool_peers_per_prompt (default: the coordinator's, 7; with at most "
                        "K + 1 agents every agent gets the whole pool)")
    p.add_argument("--peer-choice", choices=PEER_CHOICES, default=None,
                   help="which K peers where a prompt has more, as a coordinator's pool_peer_choice: drawn (a keyed "
                        "hash, each equally likely; the default) or successes (the groups with the most verified "
                        "reward, ties drawn)")
    p.add_argument("--answer-keys", choices=ANSWER_KEYS, default="public",
                   help="who holds the task's answers, as a coordinator's answer_keys: public (every lab claims "
                        "its rewards, the coordinator re-verifies; the default) or coordinator (labs get questions "
                        "only and their verified rewards with the pool)")
    p.add_argument("--dedup-successes", action="store_true",
                   help="as a coordinator's dedup_successes: a long success repeated in a group, or already "
                        "accepted from another lab for the prompt, counts once for P-hat and the successes choice")
    p.add_argument("--format-gate", action="store_true",
                   help="as a coordinator's format_gate: a lab's group for a prompt with a sample outside the task's "
                        "response format (what a lab's inbound filter leaves out) earns no P-hat or successes reach")

def run_from_args(args: Any) -> int:
    agents = tuple(a.strip() for a in args.agents.split(",") if a.strip())
    try:
        return _run_checked(args, agents)
    except ValueError as exc:  # a bad option or model spec: a message, not a traceback
        print(f"hacfed sim: error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:  # a data-parallel rank died (--nproc): its name and exit, not a traceback
        if type(exc).__name__ != "RankFailure":
            raise
        print(f"hacfed sim: error: {exc}", file=sys.stderr)
        return 1


def _run_checked(args: Any, agents: tuple[str, ...]) -> int:
    sizes = {**RUN_SIZE_DEFAULTS, **TASK_RUN_SIZES.get(args.task, {})}
    sizes.update({k: getattr(args, k) for k in sizes if getattr(args, k) is not None})
    cfg = SimConfig(
        agents=agents, mode=args.mode, rounds=args.rounds, seed=args.seed, **sizes,
        max_new_tokens=args.max_new_tokens or TASKS[args.task][1], temperature=args.temperature,
        eval_every=args.eval_every,
        learning_rate=args.lr, finetune=args.finetune,
        task=_task_spec(args.task, args.digits),
        state_dir=args.state_dir, eval_split=args.eval_split, eval_sampled=args.eval_sampled,
        text_filter=not args.no_text_filter, deny_strings=tuple(args.deny),
        eval_start=args.eval_start,
        hacpo_overrides=parse_hacpo_overrides(args.hacpo), nproc=args.nproc,
        minibatch_size=args.minibatch_size, peers_per_prompt=args.peers_per_prompt, peer_choice=args.peer_choice,
        answer_keys=args.answer_keys, dedup_successes=args.dedup_successes, format_gate=args.format_gate,
        max_staleness=args.max_staleness,
        lab_speeds=parse_lab_speeds(args.lab_speed), round_join=args.round_join,
    )
    metrics_out = Path(args.metrics_out) if args.metrics_out else None
    if metrics_out:
        metrics_out.parent.mkdir(parents=True, exist_ok=True)
    if args.threads < 0:
        raise ValueError(f"--threads must be >= 0, got {args.threads}")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    on_row, close_sinks = _tensorboard_rows(Path(args.tensorboard), participant_ids(agents)) if args.tensorboard \
        else (None, lambda: None)
    t0 = time.perf_counter()
    try:
        rows = run_sim(cfg, metrics_out, progress=not args.quiet and sys.stderr.isatty(), on_row=on_row)
    finally:
        close_sinks()
    print(summary_table(rows))
    where = f"; metrics in {metrics_out}" if metrics_out else ""
    print(f"{cfg.rounds} rounds in {time.perf_counter() - t0:.0f} s{where}{simulated_end(rows)}")
    return 0


def _task_spec(name: str, digits: int) -> dict:
    """The task table of `--task NAME`, with `--digits` for the arithmetic tasks."""
    spec = dict(TASKS[name][0])
    return {**spec, "digits": digits} if spec["kind"] == "arithmetic" else spec


def _tensorboard_rows(root: Path, ids: Sequence[str]) -> tuple[Callable[[dict], None], Callable[[], None]]:
    """(on_row, close): each agent's rows to `root/<agent>` (hacfed.metrics_sinks, the JSONL keys as tags)."""
    from hacfed.metrics_sinks import open_logger, require_tensorboard

    require_tensorboard()  # a MissingPackage (ValueError): one line, exit 2, before any model loads
    loggers = {pid: open_logger(tensorboard_dir=root / pid) for pid in ids}

    def close() -> None:
        for logger in loggers.values():
            logger.close()

    return (lambda row: loggers[row["agent"]].write(row)), close


def parse_hacpo_overrides(items: Sequence[str]) -> dict:
    """["cross_clip=false", "alpha=2"] -> {"cross_clip": False, "alpha": 2.0}, typed by HacpoConfig's defaults."""
    from hacfed.hacpo_config import HacpoConfig

    defaults = HacpoConfig().to_dict()
    out: dict = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or key not in defaults or key == "mode":
            keys = sorted(k for k in defaults if k != "mode")
            raise ValueError(f"--hacpo expects KEY=VALUE with KEY one of {keys}, got {item!r}")
        default = defaults[key]
        if isinstance(default, bool):
            if raw.lower() not in ("true", "false"):
                raise ValueError(f"--hacpo {key} must be true or false, got {raw!r}")
            out[key] = raw.lower() == "true"
        else:
            try:
                out[key] = type(default)(raw)
            except ValueError:
                raise ValueError(f"--hacpo {key} must be a {type(default).__name__}, got {raw!r}") from None
    return out
