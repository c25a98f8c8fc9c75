"""`hacfed sim`: a whole federation in one process, with the real coordinator and participants.

    hacfed sim --agents tiny-llama,tiny-gpt2 --mode hacpo --rounds 30 --seed 0 --metrics-out runs/sim.jsonl

The same coordinator logic as a real federation (seeded prompt plans shared by all agents,
re-verification, capability tracker, SQLite journal, redistribution of the pool) driven with direct
calls instead of a network (`hacfed.server.coordinator.transport.run_rounds`).

Modes are listed by `hacfed sim --help` (hacfed.tools.modes): the recommended `xhacpo`, paper-exact
`hacpo`, the baselines `naive`, `sapo`, `gspo`, `gspo2` (each agent alone with 2G responses per
prompt: the paper's GSPO×2) and `grpo`, and the ablations. Every mode uses the same minibatch size
(prompts × G / 2), so gspo2 makes twice the updates of gspo, as in the paper.

An agent `hostile:KIND` is a weak or hostile lab (hacfed.tools.hostile: copy-gold, canary:TEXT,
lie-logprob, weak) that the coordinator verifies, weighs and shares like any other; with a canary
lab, the honest agents' evaluation rows carry `eval_canary_rate`.
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from hacfed.messages import ANSWER_KEYS, PEER_CHOICES
from hacfed.tools import hostile
from hacfed.tools.modes import MODE_NAMES, get_mode, hacpo_config_for
from hacfed.tools.sim_paced import check_pacing, run_paced_sim
from hacfed.truncation_warnings import TruncationWarnings

SIM_MODES = MODE_NAMES
DEFAULT_LR = 5e-5  # chosen on the validation split (docs/results.md)
# name -> (task spec, response budget; None: the task's own `max_new_tokens`)
TASKS = {
    "add2": ({"kind": "arithmetic", "digits": 2, "operators": "+", "num_validation": 200}, 6),
    # The same sums asked in a sentence, for pretrained chat models; the budget is the task's own.
    # 500 held-out problems, so a report can evaluate on 500 (--eval-problems 500).
    "add2-words": ({"kind": "arithmetic", "digits": 2, "operators": "+", "num_eval": 500, "num_validation": 200,
                    "style": "words"}, None),
    # One-step add/sub word problems told as stories (hacfed.tasks.story); the budget is the task's own.
    "add2-story": ({"kind": "story"}, None),
    # GSM8K from the copy that ships with hacfed; its budget is the task's (hacfed.tasks.math_data).
    "gsm8k": ({"kind": "gsm8k"}, None),
    "chain": ({"kind": "chain", "terms": 3}, 40),
    # The same chains, half of the prompts written in words (the notations skills setting).
    "chain-notations": ({"kind": "chain", "terms": 3, "notations": ["sym", "word"]}, 40),
}

# Run sizes a task changes from the defaults: a GSM8K answer is hundreds of tokens, so one round
# with the defaults' 16 prompts x 8 samples and 200 held-out problems would take an hour on a CPU.
TASK_RUN_SIZES = {"gsm8k": {"prompts_per_round": 2, "group_size": 4, "eval_problems": 8}}
RUN_SIZE_DEFAULTS = {"prompts_per_round": 16, "group_size": 8, "eval_problems": 200}
TRUNCATION_SETTING = "--max-new-tokens"


@dataclass(frozen=True)
class SimConfig:
    agents: tuple[str, ...] = ("tiny-llama", "tiny-gpt2")
    mode: str = "xhacpo"
    rounds: int = 30
    seed: int = 0
    prompts_per_round: int = 16
    group_size: int = 8
    max_new_tokens: int | None = 6  # None: the task's own budget (its `max_new_tokens`)
    # Rollout temperature T. Every log-prob of a ratio (a rollout's summary, the learner's, the
    # reference's) is of the policy tempered at T (hacfed.rollout.hf, hacfed.rollout.logprobs).
    temperature: float = 1.0
    eval_every: int = 5
    eval_problems: int = 200
    learning_rate: float = 5e-5
    finetune: str = "auto"  # "full", "lora", or by model size (hacfed.models.memory)
    task: dict = field(default_factory=lambda: dict(TASKS["add2"][0]))
    hacpo_overrides: dict = field(default_factory=dict)  # e.g. {"cross_clip": False} (ablations)
    state_dir: str | None = None
    eval_split: str = "test"
    eval_sampled: bool = False
    # Each honest lab's text filter (hacfed.clients.textfilter): on, inbound and outbound, with the default
    # deny-list (URLs, e-mail addresses) and these literal strings (known canaries) added.
    text_filter: bool = True
    deny_strings: tuple[str, ...] = ()
    # False: no evaluation at round 0. The round-0 policy is the loaded model (a LoRA adapter starts
    # as the identity), so a matrix that evaluates it once can skip it in every other run.
    eval_start: bool = True
    nproc: int = 1  # data-parallel processes per agent's training and rollouts (hacfed.clients.distributed)
    # Samples per optimizer step; None: prompts × G / 2, the paper's 2 updates per source (2N per round).
    minibatch_size: int | None = None
    # Each lab is sent its own samples and, per prompt, the groups of at most this many other labs
    # (hacfed.server.coordinator.pool_share); None: the coordinator's default. With N <= K + 1 labs
    # every lab gets the whole pool.
    peers_per_prompt: int | None = None
    # Which K peers where a prompt has more (hacfed.messages.PEER_CHOICES); None: the coordinator's ("drawn").
    peer_choice: str | None = None
    # A coordinator's answer_keys (hacfed.messages.ANSWER_KEYS): "public" (development) or "coordinator".
    answer_keys: str = "public"
    # A coordinator's dedup_successes and format_gate (docs/security.md): off keeps P̂ the paper's.
    dedup_successes: bool = False
    format_gate: bool = False
    max_staleness: int = 0  # bounded staleness (docs/staleness.md): up to K rounds ahead of the slowest; 0: in step
    # (agent id, factor) pairs: that lab's compute takes factor times as long on the simulated clock
    # (hacfed.tools.sim_paced). With any of these three set the run is paced on that clock; rows carry `sim/*`.
    lab_speeds: tuple[tuple[str, float], ...] = ()
    round_join: str = "every"  # "newest": a lab joins the newest round, a slow one skips rounds (docs/staleness.md)

    @property
    def paced(self) -> bool:
        return self.max_staleness > 0 or bool(self.lab_speeds) or self.round_join != "every"

    def __post_init__(self) -> None:
        if self.mode not in SIM_MODES:
            raise ValueError(f"mode must be one of {SIM_MODES}, got {self.mode!r}")
        if not self.agents:
            raise ValueError("agents must name at least one model")
        specs = [hostile.parse_agent(a) for a in self.agents]  # a bad hostile:KIND fails here, in one line
        if all(spec is not None for spec in specs):
            raise ValueError(f"agents must name at least one model (an honest lab), got {','.join(self.agents)}")
        if self.nproc != 1 and any(spec is not None for spec in specs):
            raise ValueError(f"hostile agents run with nproc 1 only, got nproc {self.nproc!r}")
        for name in ("rounds", "prompts_per_round", "group_size", "max_new_tokens", "eval_problems"):
            value = getattr(self, name)
            if name == "max_new_tokens" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.eval_every < 0:
            raise ValueError(f"eval_every must be >= 0, got {self.eval_every!r}")
        if not (self.learning_rate > 0 and math.isfinite(self.learning_rate)):
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate!r}")
        for name in ("minibatch_size", "peers_per_prompt"):  # None: the default (see the fields)
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.peer_choice is not None and self.peer_choice not in PEER_CHOICES:
            raise ValueError(f"peer_choice must be one of {', '.join(PEER_CHOICES)}, got {self.peer_choice!r}")
        if self.answer_keys not in ANSWER_KEYS:
            raise ValueError(f"answer_keys must be one of {', '.join(ANSWER_KEYS)}, got {self.answer_keys!r}")
        if isinstance(self.nproc, bool) or not isinstance(self.nproc, int) or not 1 <= self.nproc <= 64:
            raise ValueError(f"nproc must be an integer in 1..64, got {self.nproc!r}")
        check_pacing(self.max_staleness, self.lab_speeds, participant_ids(self.agents), self.round_join)


def participant_ids(agents: Sequence[str]) -> list[str]:
    """One id per agent (a hostile lab's is `hostile-KIND`); a name used twice gets a suffix."""
    ids: list[str] = []
    for agent in agents:
        spec = hostile.parse_agent(agent)
        name = agent if spec is None else spec.name
        pid, k = name, 2
        while pid in ids:
            pid, k = f"{name}-{k}", k + 1
        ids.append(pid)
    return ids


class _Recorder:
    """Wraps a participant endpoint and remembers the report of its final (plan-less) answer. With
    `canary_rate` (an honest lab's, when a canary lab runs), each report that has an evaluation also
    carries `eval_canary_rate`: canary_rate(participant) -> the rate (hacfed.tools.hostile)."""

    def __init__(self, participant: Any, canary_rate: Callable[[Any], float] | None = None,
                 eval_start: bool = True) -> None:
        self.inner = participant
        self.participant_id = participant.participant_id
        self.final_report = None
        self.canary_rate = canary_rate
        self.eval_start = eval_start

    def exchange(self, update):
        plan = update.next_plan
        if not self.eval_start and plan is not None and plan.round_id == 0 and plan.evaluate:
            update = replace(update, next_plan=replace(plan, evaluate=False))
        submission = self.inner.step(update)
        report = None if submission is None else submission.report
        if self.canary_rate is not None and report is not None and report.eval_accuracy is not None:
            metrics = {**report.metrics, "eval_canary_rate": self.canary_rate(self.inner)}
            submission = replace(submission, report=replace(report, metrics=metrics))
        if update.next_plan is None:
            self.final_report = None if submission is None else submission.report
        return submission


EVAL_EXTRAS = ("eval_pass1", "eval_canary_rate")


def _eval_extras(metrics: dict) -> dict:
    """The evaluation's other scores a report carries: sampled pass@1, greedy accuracy per half and, with a
    canary lab in the run, the canary rate."""
    return {k: v for k, v in metrics.items() if k in EVAL_EXTRAS or k.startswith("eval_greedy/")}


def _coordinator_config(cfg: SimConfig, task: Any, ids: Sequence[str]):
    """The coordinator's settings for this run; its state in `cfg.state_dir`, else a fresh temp folder."""
    from hacfed.messages import SamplingParams
    from hacfed.server.coordinator.config import CoordinatorConfig

    group = cfg.group_size * get_mode(cfg.mode).rollout_multiplier
    state_dir = Path(cfg.state_dir) if cfg.state_dir else Path(tempfile.mkdtemp(prefix="hacfed-sim-"))
    return CoordinatorConfig(
        run_id=f"sim-{cfg.mode}-s{cfg.seed}", task=cfg.task, rounds=cfg.rounds,
        prompts_per_round=cfg.prompts_per_round, group_size=group, expected_participants=len(ids),
        min_participants=len(ids), round_deadline_s=3600.0, state_dir=state_dir,
        sampling=SamplingParams(max_new_tokens=response_budget(cfg.max_new_tokens, task), temperature=cfg.temperature),
        hacpo=hacpo_config_for(cfg.mode, cfg.hacpo_overrides),
        eval_every=cfg.eval_every, seed=cfg.seed, answer_keys=cfg.answer_keys, dedup_successes=cfg.dedup_successes,
        format_gate=cfg.format_gate, max_staleness=cfg.max_staleness, round_join=cfg.round_join,
        **({"pool_peers_per_prompt": cfg.peers_per_prompt} if cfg.peers_per_prompt is not None else {}),
        **({"pool_peer_choice": cfg.peer_choice} if cfg.peer_choice is not None else {}),
    )


def _endpoints(cfg: SimConfig, task: Any, ids: Sequence[str], min_mean_logp: float) -> list[_Recorder]:
    """One endpoint per agent, wrapped to remember its final report, in exchange order: the honest labs
    (their models loaded) first, then the hostile ones (`hacfed.tools.hostile`), so that a log-prob liar
    reads the honest learners as they stand when they next train."""
    specs = [hostile.parse_agent(a) for a in cfg.agents]
    canary = hostile.canary_of(cfg.agents)
    rate = None if canary is None else _canary_rate(cfg, task, canary)
    honest = [_participant(cfg, task, pid, spec) for pid, spec, h in zip(ids, cfg.agents, specs) if h is None]
    endpoints = [_Recorder(p, rate, cfg.eval_start) for p in honest]
    first_model = next(a for a, h in zip(cfg.agents, specs) if h is None)
    for pid, spec in zip(ids, specs):
        if spec is None:
            continue
        if spec.kind == "lie-logprob":
            from hacfed.tools.logprob_liar import LogprobLiar

            inner = _participant(cfg, task, pid, spec.model or first_model)
            endpoints.append(_Recorder(LogprobLiar(inner, honest, min_mean_logp), eval_start=cfg.eval_start))
        else:
            endpoints.append(_Recorder(hostile.ScriptedLab(pid, spec, task, cfg.seed)))
    return endpoints


def _participant(cfg: SimConfig, task: Any, pid: str, spec: str) -> Any:
    """A participant for model `spec`, its model loaded."""
    from hacfed.clients.participant import Participant, ParticipantConfig
    from hacfed.models.loading import load_model

    minibatch = cfg.minibatch_size or max(1, cfg.prompts_per_round * cfg.group_size // 2)  # paper: 2 per source
    loaded = load_model(spec)
    pcfg = ParticipantConfig(
        pid, spec, finetune=cfg.finetune, learning_rate=cfg.learning_rate, minibatch_size=minibatch,
        eval_problems=cfg.eval_problems, seed=cfg.seed, eval_split=cfg.eval_split,
        eval_sampled=cfg.eval_sampled, inbound_filter=cfg.text_filter, outbound_filter=cfg.text_filter,
        deny_strings=cfg.deny_strings,
    )
    return Participant(pcfg, loaded.model, loaded.tokenizer, task)


def _canary_rate(cfg: SimConfig, task: Any, canary: str) -> Callable[[Any], float]:
    """participant -> the canary rate of its greedy and sampled answers to the problems its evaluation scores."""
    budget = response_budget(cfg.max_new_tokens, task)
    return lambda p: hostile.held_out_canary_rate(
        p.model, p.tokenizer, task, canary, split=cfg.eval_split, problems=cfg.eval_problems,
        max_new_tokens=budget, seed=cfg.seed,
    )


def _round_rows(cfg: SimConfig, outcome: Any, warnings: TruncationWarnings) -> tuple[list[dict], list[str]]:
    """(one metrics row per participant of a finished round, the truncation warnings it raises)."""
    rows, raised = [], []
    for m in outcome.summary.participants:
        row = {"round": outcome.round_id, "agent": m.participant_id, "mode": cfg.mode, "seed": cfg.seed,
               "reward_mean": m.reward_mean, "accepted": m.accepted, "rejected": m.rejected,
               "capability": m.capability}
        truncated = m.train_metrics.get("rollout_truncated_frac")
        if truncated is not None:
            row["rollout_truncated_frac"] = truncated
            warning = warnings.check(m.participant_id, truncated)
            if warning:
                raised.append(warning)
        if m.eval_accuracy is not None:
            row["eval_accuracy"] = m.eval_accuracy
            row.update(_eval_extras(m.train_metrics))
        row.update({f"train/{k}": v for k, v in m.train_metrics.items()})
        rows.append(row)
    return rows, raised


def _final_rows(cfg: SimConfig, endpoints: Sequence[_Recorder]) -> list[dict]:
    """One row per participant whose final (plan-less) answer reported an evaluation."""
    rows = []
    for ep in endpoints:
        report = ep.final_report
        if report is not None and report.eval_accuracy is not None:
            row = {"round": cfg.rounds, "agent": ep.participant_id, "mode": cfg.mode, "seed": cfg.seed,
                   "eval_accuracy": report.eval_accuracy, "final": True}
            row.update(_eval_extras(report.metrics))
            # The last pool's training, as a coordinator's final row has it (skipped samples, losses).
            row.update({f"train/{k}": v for k, v in report.metrics.items()})
            rows.append(row)
    return rows


def run_sim(cfg: SimConfig, metrics_out: Path | None = None, progress: bool = True,
            on_row: Callable[[dict], None] | None = None) -> list[dict]:
    """Run the federation; returns the metrics rows (also written to `metrics_out` as JSONL)."""
    from tqdm import tqdm

    from hacfed.server.coordinator.journal import Journal
    from hacfed.server.coordinator.state import Coordinator
    from hacfed.server.coordinator.transport import run_rounds
    from hacfed.tasks.registry import load_task

    task = load_task(cfg.task)
    ids = participant_ids(cfg.agents)
    ccfg = _coordinator_config(cfg, task, ids)  # before any model loads: a bad setting fails fast
    canary = hostile.canary_of(cfg.agents)
    if canary is not None:
        hostile.check_canary_task(task, canary)
    endpoints = _endpoints(cfg, task, ids, ccfg.min_mean_logp)
    ranks = None
    if cfg.nproc > 1:  # one process group for all agents: every rank holds a replica of each
        from hacfed.clients.distributed import start_ranks

        ranks = start_ranks(cfg.nproc, [ep.inner for ep in endpoints])
        for ep in endpoints:
            ep.inner.attach_ranks(ranks)

    rows: list[dict] = []
    out = open(metrics_out, "w") if metrics_out else None

    def emit(row: dict) -> None:
        rows.append(row)
        if out:
            out.write(json.dumps(row) + "\n")
            out.flush()
        if on_row:
            on_row(row)

    bar = tqdm(total=cfg.rounds, desc=f"sim {cfg.mode} seed {cfg.seed}", unit="round", disable=not progress)
    warnings = TruncationWarnings(TRUNCATION_SETTING)

    def rows_of(outcome) -> list[dict]:
        round_rows, raised = _round_rows(cfg, outcome, warnings)
        for warning in raised:
            tqdm.write(warning, file=sys.stderr)
        bar.set_postfix(round_postfix(outcome.summary.participants))
        bar.update(1)
        return round_rows

    try:
        records: dict = {}
        with Journal(ccfg.journal_path) as journal:
            coordinator = Coordinator(ccfg, task, journal)
            if cfg.paced:  # on the simulated clock (hacfed.tools.sim_paced)
                records = run_paced_sim(coordinator, endpoints, dict(cfg.lab_speeds), rows_of, emit)
            else:
                run_rounds(coordinator, endpoints, on_round=lambda outcome: [emit(r) for r in rows_of(outcome)])
        for row in _final_rows(cfg, endpoints):
            record = records.get((row["agent"], cfg.rounds))
            emit({**row, **(record.metrics() if record is not None else {})})
    finally:
        bar.close()
        if out:
            out.close()
        if ranks is not None:
            ranks.close()
    return rows


def response_budget(max_new_tokens: int | None, task: Any) -> int:
    """The run's response budget: the one asked for, else the task's own (`max_new_tokens`)."""
    if max_new_tokens is not None:
        return max_new_tokens
    own = getattr(task, "max_new_tokens", None)
    if own is None:
        raise ValueError(f"task {task.name} has no response budget of its own: pass --max-new-tokens")
    return own


def round_postfix(participants: Sequence[Any]) -> dict[str, str]:
    """The progress bar's per-agent text: mean reward and, when any, the truncated fraction."""
    out = {}
    for m in participants:
        if m.reward_mean is None:
            continue
        truncated = m.train_metrics.get("rollout_truncated_frac")
        out[m.participant_id] = f"{m.reward_mean:.2f}" + (f" cut {truncated:.0%}" if truncated else "")
    return out


def summary_table(rows: Sequence[dict]) -> str:
    """Per agent: first and final held-out accuracy, mean reward over the first/last 5 rounds, and
    the mean fraction of its responses cut at the budget."""
    agents = sorted({r["agent"] for r in rows})
    lines = [f"{'agent':<16} {'acc start':>9} {'acc final':>9} {'reward first5':>13} {'reward last5':>12} {'cut':>5}"]
    for agent in agents:
        mine = [r for r in rows if r["agent"] == agent]
        evals = [r for r in mine if r.get("eval_accuracy") is not None]
        rewards = [r["reward_mean"] for r in sorted(mine, key=lambda r: r["round"]) if r.get("reward_mean") is not None]
        start = f"{evals[0]['eval_accuracy']:.3f}" if evals and evals[0]["round"] == 0 else "-"
        final = f"{evals[-1]['eval_accuracy']:.3f}" if evals else "-"
        first5 = f"{sum(rewards[:5]) / len(rewards[:5]):.3f}" if rewards else "-"
        last5 = f"{sum(rewards[-5:]) / len(rewards[-5:]):.3f}" if rewards else "-"
        cuts = [r["rollout_truncated_frac"] for r in mine if r.get("rollout_truncated_frac") is not None]
        cut = f"{sum(cuts) / len(cuts):.0%}" if cuts else "-"
        lines.append(f"{agent:<16} {start:>9} {final:>9} {first5:>13} {last5:>12} {cut:>5}")
    return "\n".join(lines)
