"""What the live dashboard costs the rounds: the same demo federation without and with it open.

    OMP_NUM_THREADS=1 .venv/bin/python bench/dashboard_overhead.py --rounds 8 --repeats 1

Runs `hacfed demo` (hacfed-server + one hacfed-client per agent, real Flower processes on loopback)
with identical settings and seed, alternating ABBA (without, with, with, without, ... per repeat) so
a machine whose speed drifts affects both arms alike. In the "with" arm hacfed-server serves
`--dashboard 127.0.0.1:0` and a poller behaves like a browser tab that stays open: the page and its
assets once, then /api/state every --poll-s seconds (the page polls every 2 s), `--pollers` tabs.
Reports each arm's median round time (the journal's opened -> closed time of rounds 1..R-1, from the
metrics rows), their ratio (goal <= 1.05), how many polls were answered and how fast, and the CPU
seconds hacfed-server itself used (where the dashboard's thread runs): on a shared machine whose
speed drifts, that difference is the direct measure of what the dashboard costs, the round-time
ratio the end-to-end one.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import psutil

_URL = re.compile(r"dashboard: (http://127\.0\.0\.1:\d+/)")
_FINISHED = "federation finished"
PAGE = ("", "static/dashboard.js", "static/dashboard.css", "static/uPlot.iife.min.js", "static/uPlot.min.css")


class Poller:
    """Browser-like tabs: the page once, then /api/state every `period_s`; records latencies."""

    def __init__(self, url: str, period_s: float, tabs: int) -> None:
        self.url, self.period_s = url, period_s
        self.latencies: list[float] = []
        self.errors = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._tab, daemon=True) for _ in range(tabs)]

    def _get(self, path: str) -> None:
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(self.url + path, timeout=30) as response:
                response.read()
            if path == "api/state":
                self.latencies.append(time.perf_counter() - t0)
        except OSError:
            self.errors += 1

    def _tab(self) -> None:
        for path in PAGE:
            self._get(path)
        while not self._stop.wait(self.period_s):
            self._get("api/state")

    def start(self) -> "Poller":
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)


class ServerCpu:
    """Samples the CPU seconds (user + system) of the demo's hacfed-server until it exits."""

    def __init__(self, demo_pid: int) -> None:
        self.demo_pid, self.seconds = demo_pid, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        server = None
        while not self._stop.wait(0.5):
            try:
                if server is None:
                    server = next((c for c in psutil.Process(self.demo_pid).children()
                                   if "hacfed-server" in " ".join(c.cmdline())), None)
                if server is not None:
                    t = server.cpu_times()
                    self.seconds = t.user + t.system
            except psutil.Error:
                if server is not None:
                    return

    def stop(self) -> float:
        self._stop.set()
        self._thread.join(10)
        return self.seconds


def run_demo(args: argparse.Namespace, dashboard: bool) -> tuple[list[float], Poller | None, float]:
    with tempfile.TemporaryDirectory(prefix="hacfed-bench-dash-") as tmp:
        metrics = Path(tmp) / "metrics.jsonl"
        cmd = [str(Path(sys.executable).parent / "hacfed"), "demo", "--agents", args.agents,
               "--rounds", str(args.rounds),
               "--prompts-per-round", str(args.prompts), "--group-size", str(args.group), "--eval-every",
               str(args.eval_every), "--seed", str(args.seed), "--state-dir", str(Path(tmp) / "state"),
               "--metrics-out", str(metrics), "--plot", str(Path(tmp) / "plot.png")]
        if dashboard:
            cmd += ["--dashboard", "127.0.0.1:0"]
        demo = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        lines: list[str] = []
        poller = None
        cpu = ServerCpu(demo.pid)
        try:
            for line in demo.stdout:
                lines.append(line)
                found = _URL.search(line) if dashboard and poller is None else None
                if found:
                    poller = Poller(found.group(1), args.poll_s, args.pollers).start()
                if _FINISHED in line and poller is not None:
                    poller.stop()  # hacfed-server is about to exit, and the dashboard with it
            code = demo.wait(timeout=60)
        finally:
            server_cpu = cpu.stop()
            if poller is not None:
                poller.stop()
            if demo.poll() is None:
                os.killpg(demo.pid, signal.SIGTERM)
                demo.wait(timeout=60)
        if code != 0 or (dashboard and poller is None):
            raise SystemExit(f"the demo failed (exit {code}, dashboard seen: {poller is not None}):\n"
                             + "".join(lines)[-3000:])
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    per_round = {r["round"]: r["time_round_s"] for r in rows if not r.get("final") and "time_round_s" in r}
    return [per_round[r] for r in sorted(per_round) if r >= 1], poller, server_cpu


def main() -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--agents", default="tiny-llama,tiny-gpt2")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=4, help="prompts per round (default 4)")
    parser.add_argument("--group", type=int, default=4, help="G (default 4)")
    parser.add_argument("--eval-every", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=1, help="ABBA blocks (default 1: 2 runs per arm)")
    parser.add_argument("--poll-s", type=float, default=2.0, help="seconds between /api/state polls (page: 2)")
    parser.add_argument("--pollers", type=int, default=1, help="open tabs (default 1)")
    args = parser.parse_args()
    if args.rounds < 3 or args.repeats < 1 or args.pollers < 1 or not args.poll_s > 0:
        parser.error("need --rounds >= 3, --repeats >= 1, --pollers >= 1 and --poll-s > 0")
    times: dict[bool, list[float]] = {False: [], True: []}
    cpu: dict[bool, list[float]] = {False: [], True: []}
    latencies: list[float] = []
    errors = 0
    order = [False, True, True, False] * args.repeats
    t0 = time.perf_counter()
    for i, dashboard in enumerate(order):
        label = "with the dashboard open" if dashboard else "without the dashboard"
        print(f"[bench] run {i + 1}/{len(order)}: {label}", flush=True)
        rounds, poller, server_cpu = run_demo(args, dashboard)
        times[dashboard].extend(rounds)
        cpu[dashboard].append(server_cpu)
        if poller is not None:
            latencies.extend(poller.latencies)
            errors += poller.errors
        print(f"[bench]   median round {statistics.median(rounds):.3f} s over {len(rounds)} rounds; hacfed-server "
              f"used {server_cpu:.2f} CPU s", flush=True)
    without, with_ = statistics.median(times[False]), statistics.median(times[True])
    print(f"\nagents {args.agents}, {args.rounds} rounds x {args.prompts} prompts x G={args.group}, "
          f"{len(order)} runs (ABBA x{args.repeats}) in {time.perf_counter() - t0:.0f} s")
    print(f"median round time without the dashboard: {without:.3f} s ({len(times[False])} rounds)")
    print(f"median round time with it open:          {with_:.3f} s ({len(times[True])} rounds; "
          f"{args.pollers} tab(s) polling /api/state every {args.poll_s:g} s)")
    print(f"ratio with / without: {with_ / without:.3f} (goal <= 1.05)")
    print(f"hacfed-server CPU per run: without {statistics.mean(cpu[False]):.2f} s, "
          f"with {statistics.mean(cpu[True]):.2f} s "
          f"(the dashboard's share: {statistics.mean(cpu[True]) - statistics.mean(cpu[False]):+.2f} s per run)")
    if latencies:
        print(f"/api/state: {len(latencies)} polls answered, median {1000 * statistics.median(latencies):.1f} ms, "
              f"max {1000 * max(latencies):.1f} ms, {errors} failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
