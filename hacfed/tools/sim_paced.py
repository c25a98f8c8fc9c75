"""`hacfed sim --lab-speed AGENT=FACTOR --max-staleness K --round-join R`: labs of different speeds, simulated clock.

The run goes through `hacfed.server.coordinator.transport.run_paced` (docs/staleness.md): each lab's step
costs its compute time at speed 1 times its factor, and events are ordered on that clock. The compute
time is a deterministic cost, not a measurement, so the schedule, and with it every result, depends
only on the run's settings and seed, never on the machine's load:

    cost = parameters x (2 x response tokens rolled out + 6 x response tokens trained on) / 1e9

(a forward pass costs about 2 FLOPs per parameter and token, a training pass about 6), that is
simulated seconds on a nominal 1 GFLOP/s device. Response tokens are counted as their sources
tokenized them (`source_token_count`); prompts and the held-out evaluation are left out. A scripted
hostile lab (no model) costs as much as the first honest lab would.

With `--round-join newest` a lab that finished its step joins the newest round instead of rolling out
every round (`hacfed.server.coordinator.engine`): a slow lab skips rounds, each lab evaluates
every `eval_every` of its own steps, rows exist only for the rounds a lab took, with `sim/own_step`,
and a step is sent of each peer only its newest round (`sim/skipped_samples`: what it was not sent).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

from hacfed.messages import ROUND_JOINS, RoundUpdate, Submission

NOMINAL_FLOPS = 1e9  # FLOPs per simulated second


def add_pacing_arguments(p: Any) -> None:
    """`hacfed sim`'s --max-staleness and --lab-speed (an argparse parser)."""
    p.add_argument("--max-staleness", type=int, default=0, metavar="K",
                   help="bounded staleness (docs/staleness.md): a lab that finished its step trains on the verified "
                        "samples it has, at most K rounds old, instead of waiting for slower labs; 0 (the default) "
                        "is the synchronous federation")
    p.add_argument("--lab-speed", action="append", default=[], metavar="AGENT=FACTOR",
                   help="run on a simulated clock on which AGENT's compute (a deterministic cost: parameters x "
                        "tokens) takes FACTOR times as long, e.g. tiny-gpt2=4 (repeatable; other agents 1); rows "
                        "then carry sim/* (start, idle, staleness of what each agent trained on)")
    p.add_argument("--round-join", choices=("every", "newest"), default="every",
                   help="which round a lab rolls out when it starts a step (docs/staleness.md): every (the default: "
                        "each lab rolls out every round) or newest (it joins the newest round, or opens the next one "
                        "within --max-staleness, so a fast lab does not wait for a slow one, which skips rounds; "
                        "each lab evaluates every --eval-every of its own steps); runs on the simulated clock")


def parse_lab_speeds(items: Sequence[str]) -> tuple[tuple[str, float], ...]:
    """["tiny-gpt2=4"] -> (("tiny-gpt2", 4.0),); each item AGENT=FACTOR, factor in [MIN_SPEED, MAX_SPEED],
    each agent once (whether the agent exists is `SimConfig`'s check)."""
    from hacfed.server.coordinator.transport import MAX_SPEED, MIN_SPEED

    out: dict[str, float] = {}
    for item in items:
        agent, sep, raw = item.partition("=")
        agent = agent.strip()
        if not sep or not agent:
            raise ValueError(f"--lab-speed expects AGENT=FACTOR (e.g. tiny-gpt2=4), got {item!r}")
        try:
            factor = float(raw)
        except ValueError:
            raise ValueError(f"--lab-speed {agent}: FACTOR must be a number > 0, got {raw!r}") from None
        if not math.isfinite(factor) or not MIN_SPEED <= factor <= MAX_SPEED:
            raise ValueError(f"--lab-speed {agent}: FACTOR must be a number from {MIN_SPEED:g} to {MAX_SPEED:g}, "
                             f"got {raw!r}")
        if agent in out:
            raise ValueError(f"--lab-speed names {agent} twice")
        out[agent] = factor
    return tuple(out.items())


def check_pacing(max_staleness: int, lab_speeds: Sequence[tuple[str, float]], ids: Sequence[str],
                 round_join: str = "every") -> None:
    """A SimConfig's K, lab speeds and round_join: K an integer >= 0, each speed for an agent of the
    run, in [MIN_SPEED, MAX_SPEED], round_join "every" or "newest"."""
    from hacfed.server.coordinator.transport import check_speeds

    check_max_staleness(max_staleness)
    check_speeds(dict(lab_speeds), ids)
    check_round_join(round_join)


def check_max_staleness(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"max_staleness must be an integer >= 0, got {value!r}")
    return value


def check_round_join(value: object) -> str:
    if value not in ROUND_JOINS:
        raise ValueError(f"round_join must be one of {', '.join(map(repr, ROUND_JOINS))}, got {value!r}")
    return value  # type: ignore[return-value]



def parameters_of(endpoint: Any) -> int | None:
    """The parameter count of the model behind a sim endpoint (through its wrappers), None for none."""
    seen = endpoint
    for _ in range(4):
        model = getattr(seen, "model", None)
        if model is not None and hasattr(model, "num_parameters"):
            return int(model.num_parameters())
        seen = getattr(seen, "inner", None)
        if seen is None:
            return None
    return None


def flop_cost(endpoints: Sequence[Any]) -> Callable[[str, RoundUpdate, Submission | None], float]:
    """cost(lab, update, submission) -> simulated seconds at speed 1 (module docstring)."""
    params = {ep.participant_id: parameters_of(ep) for ep in endpoints}
    default = next((p for p in params.values() if p is not None), 1)
    params = {pid: p if p is not None else default for pid, p in params.items()}

    def cost(lab: str, update: RoundUpdate, submission: Submission | None) -> float:
        trained = sum(t.source_token_count for t in update.pool)
        rolled = 0 if submission is None else sum(t.source_token_count for t in submission.trajectories)
        return params[lab] * (2 * rolled + 6 * trained) / NOMINAL_FLOPS

    return cost


def simulated_end(rows: Sequence[dict]) -> str:
    """"; simulated: A 12.3 s, B 48.1 s", when each agent finished on the simulated clock; "" for an unpaced run."""
    ends: dict[str, float] = {}
    for row in rows:
        if "sim/finish_s" in row:
            ends[row["agent"]] = max(ends.get(row["agent"], 0.0), row["sim/finish_s"])
    return "; simulated: " + ", ".join(f"{a} {t:.1f} s" for a, t in ends.items()) if ends else ""


def run_paced_sim(
    coordinator: Any, endpoints: Sequence[Any], speeds: Mapping[str, float],
    rows_of: Callable[[Any], list[dict]], emit: Callable[[dict], None],
) -> dict[tuple[str, int], Any]:
    """Run the federation on the simulated clock; each closed round's rows (`rows_of(outcome)`) get
    their lab's `sim/*` keys (`StepRecord.metrics`) before `emit`; with round_join "newest" only the
    rows of the labs that took the round. Returns every step record."""
    from hacfed.server.coordinator.transport import run_paced

    joining = coordinator.cfg.round_join == "newest"

    def on_round(outcome: Any) -> None:
        for row in rows_of(outcome):
            record = outcome.steps.get(row["agent"])
            if record is None and joining:
                continue  # the lab did not take this round
            emit({**row, **(record.metrics() if record is not None else {})})

    _, records = run_paced(coordinator, endpoints, speeds, flop_cost(endpoints), on_round=on_round)
    return records
