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
math-verify decides (a dollar amount takes the numeric fast path); token counts
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
  poll     what the ServerApp's loop asks between two pulls while a round is open: `close_round`
           (nothing closes yet) and `next_round`, which sends the labs just judged their answers
           (an answers-only delivery each, whose reply, with no submission, comes in the next pull);
           here once after each pull but the last
  close    the `close_round` that closes the round (capabilities, round summary, metrics rows)
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
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

GROUPS = {"decode": ("decode",), "verify": ("validate", "reward"), "journal": ("journal",), "pool": ("pool",)}

sys.path.insert(0, str(Path(__file__).resolve().parent))
from coordinator_scale_labs import ScaleConfig, generate, lab_ids  # noqa: E402  (the labs' side)
from coordinator_scale_probes import (  # noqa: E402  (timers and meters)
    PHASES,
    PhaseClock,
    RssSampler,
    instrumented,
    reference_work_s,
    workers_cpu,
    workers_rss,
)

# ---- the coordinator's side, timed -------------------------------------------------------------------


def measure(work: Path, replies_per_pull: int = 8) -> dict[str, Any]:
    """Run every round of the generated run through a fresh FederationDriver, handing it the labs'
    replies `replies_per_pull` at a time as the ServerApp's round loop hands over one pull's
    (`FederationDriver.on_replies`); per-round phases."""
    import hacfed.server.driver as driver_mod
    from hacfed.server.allocator import keep_freed_memory
    from hacfed.server.collector import freeze_startup_objects
    from hacfed.server.config import read_server_config

    config = read_server_config(work / "driver-settings.json")
    driver = driver_mod.FederationDriver(config)
    keep_freed_memory()  # as make_driver does in the ServerApp
    freeze_startup_objects()
    clock, sizes = PhaseClock(), []
    cfg = config.coordinator
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
            nodes, answered = list(participants.items()), {}
            for first in range(0, len(nodes), replies_per_pull):
                pulled = [(node, (work / "replies" / "ack" / f"{participants[node]}.bin").read_bytes())
                          for node in answered]  # not timed: the transport's pull
                pulled += [(node, (work / "replies" / str(round_id) / f"{pid}.bin").read_bytes())
                           for node, pid in nodes[first:first + replies_per_pull]]
                start = time.perf_counter()
                with clock.phase("other"):
                    driver.on_replies(pulled)
                if first + replies_per_pull < len(nodes):
                    with clock.phase("poll"):  # the loop's close_round and next_round poll (every 0.2 s)
                        driver.close_round()
                        answered = driver.next_round(participants) or {}
                    if set(answered) != {node for node, _ in nodes[first:first + replies_per_pull]}:
                        raise RuntimeError(f"round {round_id}: mid-round the driver sent to {sorted(answered)}")
                total += time.perf_counter() - start
                del pulled
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


def _digest(items: list[str]) -> str:
    import hashlib

    return hashlib.sha256("\n".join(items).encode("utf-8")).hexdigest()


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
        "load_average": statistics.median(r.get("load_average", 0.0) for r in timed),
        "sandbox_calls": measured["sandbox_calls"],
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
            " ".join(f"{p:>8}" for p in PHASES) +
            f" {'RSS MiB':>8} {'+MiB/lab':>8} {'update MiB':>10} {'sent MiB':>8} {'load':>5}"
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
