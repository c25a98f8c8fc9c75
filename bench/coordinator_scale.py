"""Coordinator scale: N labs x 1,000 trajectories per round through the real round driver.

    OMP_NUM_THREADS=1 .venv/bin/python bench/coordinator_scale.py --labs 4,16,64 --out runs/coordinator-scale.json

What it measures is the coordinator's own work in one round, in the ServerApp's code path: the
round driver (`hacfed.server.driver.FederationDriver`) is called exactly as the ServerApp's round
loop calls it (`next_round`, then `on_replies` with the reply bytes of one pull, `--replies-per-pull`
labs at a time, default 8, then `close_round`), over
the real `Coordinator`, SQLite journal (WAL, synchronous=FULL), audit log and GSM8K reward verifier
(math-verify behind its numeric fast path). Flower's transport is left out: the labs' replies are
handed over in process. Each reply is what a lab really sends: a `Submission` encoded by
`hacfed.wire`, sealed with the lab's Ed25519 key, packed into a signed `LabReply`, so envelope
opening, signature checks and decoding are measured too.

Before anything is timed, a generator process writes every lab's replies of every round to disk
(synthetic but GSM8K-shaped: the reference reasoning of the planned problem, reworded, ending in
`\\boxed{answer}`; about 35 % correct, the rest a wrong final number; a small fraction with a
non-plain answer, `\\$72`, `72\\text{ units}` or `72\\%` in equal shares, of which the last two only
math-verify decides (a dollar amount takes the numeric fast path since stop 26); token counts
and log-prob sums like a BPE model's). Then one fresh process per N runs the rounds, so its peak
RSS is the coordinator's alone. Per round it reports the coordinator time split into phases
(exclusive times, so they add up to the total):

  decode   open_lab_reply + open_envelope (Ed25519) + decode_submission (protobuf -> dataclasses)
  intake   caps and whole-submission gates, the content digest (sha256 of the submitted wire bytes),
           the accepted samples' pool records cut from those bytes
  validate the cheap per-trajectory checks of `start_validation`, and judging the verified groups
  reward   reward re-verification: screening every sample in process and sending the rest to up to
           two sandboxed math-verify workers, and later waiting for their verdicts (the workers' CPU
           is reported as "+wrk s"). The driver begins the next lab's submission of a pull before
           it waits for these verdicts, so the wait is mostly hidden behind that work.
  journal  SQLite: the used-id and policy-version lookups and `record_submission` (one transaction, audit line)
  answers  the signed receipts
  poll     `round_done`, which the ServerApp's round loop calls after each pull while a round is open
           (every 0.2 s); here once after each pull
  close    `close_round` (capabilities, round summary, metrics rows)
  pool     the next round's update: the pool (kept from intake with the records cut from the
           submitted bytes, or read back from the journal and encoded), each lab's selection
           spliced and signed, and one signed delivery per lab
           (sealed over two threads)
  other    the rest of the driver (membership refresh, console lines, bookkeeping)

Each lab is sent its own samples and, per prompt, the groups of at most `pool_peers_per_prompt`
(default 7) other labs (`hacfed.server.coordinator.pool_share`), each update spliced from
trajectories encoded once (`hacfed.server.round_updates`). The bench reports the largest per-lab
update, whether it is over the 16 MiB message cap (`hacfed.wire.MAX_MESSAGE_BYTES`), and the bytes
of all deliveries of a round together (what the transport would carry).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

PHASES = ("decode", "intake", "validate", "reward", "journal", "answers", "poll", "close", "pool", "other")
GROUPS = {"decode": ("decode",), "verify": ("validate", "reward"), "journal": ("journal",), "pool": ("pool",)}
RUN_ID = "coordinator-scale"
_CALC = re.compile(r"<<[^<>]*>>")


@dataclass(frozen=True)
class ScaleConfig:
    """One point of the bench: `labs` labs, each submitting prompts x group_size trajectories in
    each of `rounds` rounds (round 0 has no pool to build, so the medians use rounds 1..R-1)."""

    labs: int
    prompts: int = 125
    group_size: int = 8
    rounds: int = 4
    seed: int = 0
    correct_fraction: float = 0.35
    nonplain_fraction: float = 0.02  # non-plain answers: \$N (fast path), N\text{ units}, N\% (math-verify)
    replies_per_pull: int = 8  # how many labs' replies one pull of the ServerApp's round loop brings

    def __post_init__(self) -> None:
        for name in ("labs", "prompts", "group_size", "rounds", "replies_per_pull"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ScaleConfig.{name} must be an int >= 1, got {value!r}")
        if self.rounds < 2:
            raise ValueError(f"ScaleConfig.rounds must be >= 2 (round 0 builds no pool), got {self.rounds}")
        for name in ("correct_fraction", "nonplain_fraction"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"ScaleConfig.{name} must be in [0, 1], got {value!r}")

    @property
    def per_lab(self) -> int:
        return self.prompts * self.group_size


def lab_ids(n: int) -> list[str]:
    return [f"lab-{i:03d}" for i in range(n)]


def coordinator_settings(cfg: ScaleConfig, work: Path) -> dict[str, Any]:
    """The CoordinatorConfig mapping of the run: GSM8K from the shipped files, a quorum of all labs."""
    import hacfed

    data = Path(hacfed.__file__).resolve().parent / "data" / "gsm8k"
    return {
        "run_id": RUN_ID, "rounds": cfg.rounds, "prompts_per_round": cfg.prompts, "group_size": cfg.group_size,
        "expected_participants": cfg.labs, "min_participants": cfg.labs, "round_deadline_s": 3600.0,
        "state_dir": str(work / "server"), "eval_every": 0, "seed": cfg.seed,
        "sampling": {"max_new_tokens": 512},
        "task": {"kind": "jsonl", "name": "gsm8k", "train_files": [str(data / "train.jsonl")],
                 "eval_files": [str(data / "test.jsonl")], "answer_format": "gsm8k",
                 "cache_dir": str(work / "hf-cache")},
    }


# ---- the labs' side, before anything is timed --------------------------------------------------------


def synthetic_response(rng: random.Random, solution: str, answer: str, correct: bool, nonplain: bool) -> str:
    """A GSM8K-shaped model response: worked steps (the reference reasoning without its calculator
    annotations, with a model-like preamble and closing) and a final `\\boxed{}` answer."""
    reasoning = _CALC.sub("", solution.rsplit("The final answer is", 1)[0]).strip()
    final = answer
    if not correct:
        try:
            final = str(int(answer) + rng.choice((-10, -2, -1, 1, 2, 3, 10)))
        except ValueError:
            final = answer + "1"
    if nonplain:
        final = rng.choice((f"\\${final}", f"{final}\\text{{ units}}", f"{final}\\%"))
    opener = rng.choice(("Let's think step by step.", "Let me work through this carefully.",
                         "We solve the problem one step at a time."))
    closing = rng.choice(("So the answer is", "Therefore, the final answer is", "Putting it together, we get"))
    return f"{opener}\n{reasoning}\nLet me double-check the arithmetic once more.\n{closing} \\boxed{{{final}}}."


def generate(cfg: ScaleConfig, work: Path) -> dict[str, Any]:
    """Keys, driver settings and every lab's signed reply of every round, written under `work`.
    Returns what was submitted (counts, bytes) for the report."""
    from hacfed.envelope import DOMAIN_SUBMIT, save_public_key, seal
    from hacfed.exchange import seal_lab_reply
    from hacfed.keys import ensure_key_pair
    from hacfed.messages import StepReport, Submission
    from hacfed.server.coordinator import CoordinatorConfig, load_task_from_config, make_plan
    from hacfed.server.driver_settings import DriverSettings
    from hacfed.trajectory import Trajectory
    from hacfed.wire import PayloadType, encode_submission

    ccfg = CoordinatorConfig.from_mapping(coordinator_settings(cfg, work))
    task = load_task_from_config(ccfg)
    state = Path(ccfg.state_dir)
    keys_dir = state / "keys"
    keys_dir.mkdir(parents=True, exist_ok=True)
    coordinator_key = ensure_key_pair(state, "coordinator")
    settings = DriverSettings(ccfg.to_dict(), None, str(keys_dir), str(coordinator_key.private),
                              str(state / "metrics.jsonl"))
    settings.write(work / "driver-settings.json")
    rng = random.Random(cfg.seed)
    reply_bytes = 0
    labs = lab_ids(cfg.labs)
    keys = {}
    for pid in labs:
        pair = ensure_key_pair(work / "labs" / pid, "participant")
        keys[pid] = pair.load()
        save_public_key(keys[pid].public_key(), keys_dir / f"{pid}.pub")
    for round_id in range(cfg.rounds):
        plan = make_plan(ccfg, task, round_id)
        folder = work / "replies" / str(round_id)
        folder.mkdir(parents=True, exist_ok=True)
        for pid in labs:
            trajectories = []
            for prompt in plan.prompts:
                problem = task.problem(prompt.prompt_id)
                for i in range(plan.group_size):
                    correct = rng.random() < cfg.correct_fraction
                    text = synthetic_response(rng, problem.solution, problem.answer, correct,
                                              rng.random() < cfg.nonplain_fraction)
                    tokens = max(1, len(text) // 4)
                    trajectories.append(Trajectory(
                        trajectory_id=f"{pid}/{round_id}/{prompt.prompt_id}/{i}", prompt_id=prompt.prompt_id,
                        source_id=pid, policy_version=round_id, prompt=prompt.messages, response_text=text,
                        reward=task.verify(problem, text).reward,  # the lab's own claim, honest
                        source_logp_sum=-tokens * rng.uniform(0.05, 0.9), source_token_count=tokens,
                        finish_reason="stop",
                    ))
            metrics = {"loss": rng.uniform(0.1, 1.0), "time_rollout_s": 30.0, "time_training_s": 60.0}
            report = StepReport(pid, max(round_id - 1, 0), metrics, None)
            sub = Submission(RUN_ID, pid, round_id, tuple(trajectories), report, nonce=secrets.token_hex(16),
                             created_at_ms=int(time.time() * 1000))
            sealed = seal(encode_submission(sub), PayloadType.SUBMISSION, keys[pid], DOMAIN_SUBMIT)
            reply = seal_lab_reply(sealed, (), keys[pid])
            (folder / f"{pid}.bin").write_bytes(reply)
            reply_bytes += len(reply)
    task.close()
    return {"labs": cfg.labs, "trajectories_per_lab": cfg.per_lab, "rounds": cfg.rounds,
            "reply_bytes_per_lab_round": reply_bytes / (cfg.labs * cfg.rounds)}


# ---- the coordinator's side, timed -------------------------------------------------------------------


class PhaseClock:
    """Exclusive wall time per phase: time spent in a nested phase is not counted in its parent."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = {p: 0.0 for p in PHASES}
        self._stack: list[list[Any]] = []  # [phase, start, time spent in children]

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        self._stack.append([name, start, 0.0])
        try:
            yield
        finally:
            _, _, children = self._stack.pop()
            elapsed = time.perf_counter() - start
            self.totals[name] += elapsed - children
            if self._stack:
                self._stack[-1][2] += elapsed

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.phase(name):
                return fn(*args, **kwargs)
        return timed

    def wrap_halves(self, name: str, fn: Callable[..., Callable[[], Any]]) -> Callable[..., Callable[[], Any]]:
        """`wrap` of a function that does its work in two halves (it returns the second: a function
        of no arguments, `Coordinator.begin_submit` and the like): both halves are timed as `name`."""
        def timed(*args: Any, **kwargs: Any) -> Callable[[], Any]:
            with self.phase(name):
                return self.wrap(name, fn(*args, **kwargs))
        return timed

    def take(self) -> dict[str, float]:
        out, self.totals = self.totals, {p: 0.0 for p in PHASES}
        return out


@contextmanager
def instrumented(driver: Any, clock: PhaseClock, sizes: list[int]) -> Iterator[None]:
    """Wrap the driver's collaborators with phase timers for the duration of the block, then put
    every original back. Behaviour is unchanged."""
    import hacfed.server.coordinator.intake as intake
    import hacfed.server.coordinator.validation as validation
    import hacfed.server.replies as replies

    saved: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, replacement: Any) -> None:
        saved.append((owner, name, owner.__dict__.get(name, _ABSENT)))
        setattr(owner, name, replacement)

    import hacfed.server.round_updates as round_updates

    try:
        for name in ("open_lab_reply", "open_envelope", "decode_submission"):
            patch(replies, name, clock.wrap("decode", getattr(replies, name)))
        patch(intake, "start_validation", clock.wrap_halves("validate", intake.start_validation))
        patch(validation, "start_verified_rewards", clock.wrap_halves("reward", validation.start_verified_rewards))
        for name in ("record_submission", "used_trajectory_ids", "last_policy_version"):
            patch(driver.journal, name, clock.wrap("journal", getattr(driver.journal, name)))
        patch(driver.answers, "receipt", clock.wrap("answers", driver.answers.receipt))
        splice = round_updates.round_update_parts

        def splice_update(header: Any, items: Any) -> list[bytes]:
            parts = splice(header, items)
            sizes.append(sum(len(p) for p in parts))
            return parts

        # Each lab's update is spliced and sealed in the driver's sealing threads: sizes are recorded
        # there (list.append is atomic), time on the calling thread around all of it.
        patch(round_updates, "round_update_parts", splice_update)
        patch(round_updates, "encode_pool_items", clock.wrap("pool", round_updates.encode_pool_items))
        patch(driver, "_round_payloads", clock.wrap("pool", driver._round_payloads))
        patch(driver.coordinator, "begin_submit", clock.wrap_halves("intake", driver.coordinator.begin_submit))
        patch(driver.coordinator, "make_update", clock.wrap("pool", driver.coordinator.make_update))
        yield
    finally:
        for owner, name, original in reversed(saved):
            if original is _ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, original)


_ABSENT = object()


class RssSampler:
    """Peak resident memory of this process, sampled every 20 ms in a thread (psutil)."""

    def __init__(self) -> None:
        import psutil

        self._proc = psutil.Process()
        self.peak = self._proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self._proc.memory_info().rss)

    def now(self) -> int:
        return self._proc.memory_info().rss

    def __enter__(self) -> "RssSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.now())


def reference_work_s() -> float:
    """Seconds this process takes for a fixed piece of work like a round's (SHA-256 over 64 MiB,
    protobuf-free Python object churn, JSON), timed after each round: this machine's speed drifts
    3-10x over hours, so a round's time divided by this one says whether a run fell in a slow
    stretch. Not part of any round's time."""
    import hashlib

    block = bytes(range(256)) * 4096  # 1 MiB
    start = time.perf_counter()
    digest = hashlib.sha256()
    for _ in range(64):
        digest.update(block)
    rows = [(f"lab-{i % 64:03d}", i, float(i % 2), f"t{i}") for i in range(100_000)]
    index = {(pid, n): reward for pid, n, reward, _ in rows}
    json.dumps([list(r) for r in rows[:20_000]])
    if len(index) != len(rows) or not digest.digest():
        raise AssertionError("reference work")
    return time.perf_counter() - start


def measure(work: Path, replies_per_pull: int = 8) -> dict[str, Any]:
    """Run every round of the generated run through a fresh FederationDriver, handing it the labs'
    replies `replies_per_pull` at a time as the ServerApp's round loop hands over one pull's
    (`FederationDriver.on_replies`); per-round phases."""
    import hacfed.server.driver as driver_mod
    from hacfed.server.allocator import keep_freed_memory
    from hacfed.server.collector import freeze_startup_objects
    from hacfed.server.driver_settings import DriverSettings

    settings = DriverSettings.read(work / "driver-settings.json")
    driver = driver_mod.FederationDriver(settings)
    keep_freed_memory()  # as make_driver does in the ServerApp
    freeze_startup_objects()
    clock, sizes = PhaseClock(), []
    cfg = settings.coordinator_config
    labs = lab_ids(cfg.expected_participants)
    participants = {node: pid for node, pid in enumerate(labs, start=1)}
    # The sandboxed math-verify worker starts once per coordinator process (~2-4 s): not a round's work.
    first = driver.coordinator.task.train_problems()[0]
    driver.coordinator.task.verify(first, f"\\boxed{{\\${first.answer}}}")
    rounds: list[dict[str, Any]] = []
    verifier = driver.coordinator.task._verifier
    with RssSampler() as rss, instrumented(driver, clock, sizes):
        baseline = rss.now()
        for round_id in range(cfg.rounds):
            total, cpu, workers = 0.0, time.process_time(), workers_cpu(verifier)
            start = time.perf_counter()
            with clock.phase("other"):
                payloads = driver.next_round(participants) or {}
            total += time.perf_counter() - start
            if sorted(payloads) != sorted(participants):
                raise RuntimeError(f"round {round_id}: the driver sent to {sorted(payloads)}, not every lab")
            nodes = list(participants.items())
            for first in range(0, len(nodes), replies_per_pull):
                pulled = [(node, (work / "replies" / str(round_id) / f"{pid}.bin").read_bytes())  # not timed:
                          for node, pid in nodes[first:first + replies_per_pull]]  # the transport's pull
                start = time.perf_counter()
                with clock.phase("other"):
                    driver.on_replies(pulled)
                with clock.phase("poll"):  # the round loop asks after every pull (every 0.2 s) while waiting
                    done = driver.round_done()
                total += time.perf_counter() - start
                del pulled
            if not done:
                raise RuntimeError(f"round {round_id}: every lab submitted but the round is not done")
            start = time.perf_counter()
            with clock.phase("close"):
                driver.close_round()
            total += time.perf_counter() - start
            if driver.coordinator.current_round is not None:
                raise RuntimeError(f"round {round_id} did not close at quorum")
            cpu = time.process_time() - cpu
            worker_cpu = sum(t - workers.get(pid, 0.0) for pid, t in workers_cpu(verifier).items())
            reference = reference_work_s()  # after the round's CPU was read: not part of it
            rounds.append({"round": round_id, "total_s": total, "cpu_s": cpu, "worker_cpu_s": worker_cpu,
                           "all_cpu_s": cpu + worker_cpu, "rss_workers_bytes": workers_rss(verifier),
                           "load_average": os.getloadavg()[0], "reference_s": reference,
                           "phases_s": clock.take(),
                           "rss_bytes": rss.now(), "update_bytes": max(sizes, default=0),
                           "sent_bytes": sum(len(p) for p in payloads.values())})
            sizes.clear()
            payloads = None  # as the ServerApp's loop: a round's deliveries are gone before the next are built
        peak = rss.peak
    journal = driver.journal
    counts = {t: journal.count(t) for t in ("submissions", "trajectories", "rejections", "strikes")}
    ids = {r[0] for r in journal._db.execute("SELECT participant_id || ' ' || trajectory_id FROM trajectories")}
    sandbox_calls = driver.coordinator.task._verifier.worker_calls - 1  # less the warm-up
    driver.coordinator.task.close()
    return {"rounds": rounds, "sandbox_calls": sandbox_calls, "rss_baseline_bytes": baseline, "rss_peak_bytes": peak,
            "ru_maxrss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "journal_counts": counts, "journal_ids_sha": _digest(sorted(ids)),
            "journal_bytes": sum(p.stat().st_size for p in Path(cfg.state_dir).glob("journal.sqlite*"))}


def workers_cpu(verifier: Any) -> dict[int, float]:
    """CPU seconds (user + system) of each live math-verify worker process, by pid: the round's
    verification work that the coordinator process's own CPU time does not include. A worker
    replaced during a round (timeout, retirement) takes its CPU time with it: a lower bound."""
    import psutil

    out = {}
    for pid in verifier.worker_pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        out[pid] = times.user + times.system
    return out


def workers_rss(verifier: Any) -> int:
    """Resident bytes of the live math-verify workers together (not in the coordinator's RSS)."""
    import psutil

    total = 0
    for pid in verifier.worker_pids:
        try:
            total += psutil.Process(pid).memory_info().rss
        except psutil.Error:
            continue
    return total


def _digest(items: list[str]) -> str:
    import hashlib

    return hashlib.sha256("\n".join(items).encode("utf-8")).hexdigest()


def submitted_ids(work: Path, cfg: ScaleConfig) -> list[str]:
    """Every trajectory id in the generated replies, as `participant trajectory` (for the check)."""
    from hacfed.envelope import DOMAIN_SUBMIT, key_id, load_public_key, open_envelope
    from hacfed.exchange import open_lab_reply
    from hacfed.wire import PayloadType, decode_submission

    keys = {}
    for pid in lab_ids(cfg.labs):
        public = load_public_key(work / "server" / "keys" / f"{pid}.pub")
        keys[key_id(public)] = public
    out = []
    for round_id in range(cfg.rounds):
        for pid in lab_ids(cfg.labs):
            reply, _ = open_lab_reply((work / "replies" / str(round_id) / f"{pid}.bin").read_bytes(), keys)
            body, _ = open_envelope(reply.submission, keys, DOMAIN_SUBMIT, PayloadType.SUBMISSION)
            out.extend(f"{pid} {t.trajectory_id}" for t in decode_submission(body).trajectories)
    return sorted(out)


def summarize(cfg: ScaleConfig, generated: dict[str, Any], measured: dict[str, Any]) -> dict[str, Any]:
    """Medians over rounds 1..R-1 (the rounds that build a pool) and the derived per-unit numbers."""
    timed = measured["rounds"][1:]
    phases = {p: statistics.median(r["phases_s"][p] for r in timed) for p in PHASES}
    total = statistics.median(r["total_s"] for r in timed)
    cpu = statistics.median(r["cpu_s"] for r in timed)
    worker_cpu = statistics.median(r.get("worker_cpu_s", 0.0) for r in timed)
    all_cpu = statistics.median(r.get("all_cpu_s", r["cpu_s"]) for r in timed)
    reference = statistics.median(r.get("reference_s", 0.0) for r in timed)
    per_round = cfg.labs * cfg.per_lab
    rss_delta = measured["rss_peak_bytes"] - measured["rss_baseline_bytes"]
    from hacfed.wire import MAX_MESSAGE_BYTES

    update = max(r["update_bytes"] for r in measured["rounds"])
    sent = statistics.median(r.get("sent_bytes", 0) for r in timed)
    return {
        "config": asdict(cfg), "generated": generated,
        "round_total_s": total, "round_totals_s": [r["total_s"] for r in measured["rounds"]],
        "round_cpu_s": cpu, "round_worker_cpu_s": worker_cpu, "round_all_cpu_s": all_cpu,
        "reference_s": reference, "round_per_reference": total / reference if reference > 0 else None,
        "worker_rss_mib": max(r.get("rss_workers_bytes", 0) for r in measured["rounds"]) / 2**20,
        "load_average": statistics.median(r.get("load_average", 0.0) for r in timed), "sandbox_calls": measured["sandbox_calls"],
        "phases_s": phases, "groups_s": {g: sum(phases[p] for p in ps) for g, ps in GROUPS.items()},
        "us_per_trajectory": total / per_round * 1e6,
        "rss_baseline_mib": measured["rss_baseline_bytes"] / 2**20, "rss_peak_mib": measured["rss_peak_bytes"] / 2**20,
        "rss_growth_mib": rss_delta / 2**20, "rss_growth_mib_per_lab": rss_delta / 2**20 / cfg.labs,
        "ru_maxrss_mib": measured["ru_maxrss_bytes"] / 2**20,
        "update_mib": update / 2**20, "update_over_cap": update > MAX_MESSAGE_BYTES, "sent_mib": sent / 2**20,
        "journal_counts": measured["journal_counts"], "journal_ids_sha": measured["journal_ids_sha"],
        "journal_mib": measured["journal_bytes"] / 2**20,
    }


def run_point(cfg: ScaleConfig, work: Path, *, isolate: bool = True) -> dict[str, Any]:
    """Generate, then measure (in a fresh process when `isolate`, so its peak RSS is the
    coordinator's only); the summary."""
    generated = generate(cfg, work)
    if isolate:
        out = work / "measured.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--measure", str(work), "--measure-out", str(out),
               "--replies-per-pull", str(cfg.replies_per_pull)]
        subprocess.run(cmd, check=True, start_new_session=True, env=dict(os.environ))
        measured = json.loads(out.read_text(encoding="utf-8"))
    else:
        measured = measure(work, cfg.replies_per_pull)
    return summarize(cfg, generated, measured)


def growth(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ratios between consecutive points: time per trajectory and RSS growth per lab (1.0 = linear)."""
    out = []
    for a, b in zip(points, points[1:]):
        out.append({"from_labs": a["config"]["labs"], "to_labs": b["config"]["labs"],
                    "labs_ratio": b["config"]["labs"] / a["config"]["labs"],
                    "time_ratio": b["round_total_s"] / a["round_total_s"],
                    "us_per_trajectory_ratio": b["us_per_trajectory"] / a["us_per_trajectory"],
                    "rss_growth_per_lab_ratio": (b["rss_growth_mib_per_lab"] / a["rss_growth_mib_per_lab"]
                                                 if a["rss_growth_mib_per_lab"] > 0 else None)})
    return out


def table(points: list[dict[str, Any]]) -> str:
    head = (f"{'labs':>5} {'traj/round':>10} {'round s':>8} {'CPU s':>6} {'+wrk s':>6} {'us/traj':>8} " +
            " ".join(f"{p:>8}" for p in PHASES) + f" {'RSS MiB':>8} {'+MiB/lab':>8} {'update MiB':>10} {'sent MiB':>8} {'load':>5}"
            f" {'ref s':>6} {'round/ref':>9}")
    lines = [head]
    for p in points:
        c = p["config"]
        lines.append(
            f"{c['labs']:>5} {c['labs'] * c['prompts'] * c['group_size']:>10} {p['round_total_s']:>8.2f} "
            f"{p['round_cpu_s']:>6.2f} {p.get('round_worker_cpu_s', 0.0):>6.2f} "
            f"{p['us_per_trajectory']:>8.0f} " + " ".join(f"{p['phases_s'][k]:>8.2f}" for k in PHASES) +
            f" {p['rss_peak_mib']:>8.0f} {p['rss_growth_mib_per_lab']:>8.2f} "
            f"{p['update_mib']:>9.1f}{'!' if p['update_over_cap'] else ' '} {p['sent_mib']:>8.1f} "
            f"{p.get('load_average', 0.0):>5.1f} {p.get('reference_s', 0.0):>6.3f} "
            f"{p.get('round_per_reference') or 0.0:>9.1f}")
    lines.append("phases: median seconds per round (rounds 1..R-1); CPU s: the coordinator process, +wrk s: its "
                 "math-verify workers' CPU on top; update: the largest lab's ('!' = over the 16 MiB "
                 "message cap); sent: every delivery of the round together; load: 1-min load average during the point; "
                 "ref s: a fixed reference workload timed after each round (reference_work_s), round/ref: the round "
                 "in units of it, which machine drift changes far less than seconds")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--labs", default="4,16,64", help="comma-separated lab counts (default 4,16,64)")
    parser.add_argument("--prompts", type=int, default=125, help="prompts per round (default 125)")
    parser.add_argument("--group-size", type=int, default=8, help="G (default 8: 125 x 8 = 1,000 per lab)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds per point (default 4; medians over 1..R-1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--nonplain-fraction", type=float, default=0.02,
                        help="share of non-plain answers (\\$72, 72\\text{ units}, 72\\%%; default 0.02)")
    parser.add_argument("--replies-per-pull", type=int, default=8,
                        help="labs' replies handed to the driver together, as one pull of the ServerApp's "
                             "round loop brings them (default 8; 1: every reply alone)")
    parser.add_argument("--out", type=Path, help="write the JSON results here")
    parser.add_argument("--work-dir", type=Path, help="keep the journals here (default: a temporary folder)")
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--measure-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure is not None:
        if os.environ.get("HACFED_SCALE_PROFILE"):  # cProfile of the measuring process, for finding hot spots
            import cProfile

            with cProfile.Profile() as profile:
                measured = measure(args.measure, args.replies_per_pull)
            profile.dump_stats(os.environ["HACFED_SCALE_PROFILE"])
        else:
            measured = measure(args.measure, args.replies_per_pull)
        args.measure_out.write_text(json.dumps(measured), encoding="utf-8")
        return 0
    try:
        counts = [int(x) for x in args.labs.split(",") if x.strip()]
        configs = [ScaleConfig(labs=n, prompts=args.prompts, group_size=args.group_size, rounds=args.rounds,
                               seed=args.seed, nonplain_fraction=args.nonplain_fraction,
                               replies_per_pull=args.replies_per_pull) for n in counts]
    except ValueError as exc:
        print(f"coordinator_scale: {exc}", file=sys.stderr)
        return 2
    points = []
    with tempfile.TemporaryDirectory(prefix="hacfed-scale-") as tmp:
        root = (args.work_dir or Path(tmp)).resolve()  # the driver's settings need absolute paths
        for cfg in configs:
            work = root / f"labs-{cfg.labs}"
            if work.exists():
                print(f"coordinator_scale: {work} exists; use an empty --work-dir", file=sys.stderr)
                return 2
            point = run_point(cfg, work)
            points.append(point)
            print(f"labs {cfg.labs}: round {point['round_total_s']:.2f} s (median), peak RSS "
                  f"{point['rss_peak_mib']:.0f} MiB", file=sys.stderr, flush=True)
    result = {"points": points, "growth": growth(points), "cpu_count": os.cpu_count()}
    print(table(points))
    for g in result["growth"]:
        print(f"{g['from_labs']} -> {g['to_labs']} labs (x{g['labs_ratio']:.0f}): round time x{g['time_ratio']:.2f}, "
              f"time per trajectory x{g['us_per_trajectory_ratio']:.2f}, RSS growth per lab "
              f"x{g['rss_growth_per_lab_ratio']:.2f}" if g["rss_growth_per_lab_ratio"] else "")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
