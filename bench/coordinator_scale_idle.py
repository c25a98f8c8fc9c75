"""What idle labs cost the coordinator's SuperLink: N SuperNodes connected, no run, for a window.

    OMP_NUM_THREADS=1 .venv/bin/python bench/coordinator_scale_idle.py --labs 64 --window-s 30

Starts one SuperLink (`hacfed.server.superlink.start_superlink`, loopback, insecure) and N lab
SuperNodes as hacfed-client starts them (`hacfed.clients.supernode.start_supernode`, idle poll
0.5 s), waits until every node has registered and then `--settle-s`,
and counts over `--window-s` the Fleet API requests the SuperLink logged (FLWR_LOG_LEVEL=DEBUG
makes it log each PullMessages and SendNodeHeartbeat; the logging is part of the CPU measured) and
the SuperLink process's CPU seconds (/proc/PID/stat). `--baseline DIR` first does the same with the
SuperNodes run from the hacfed package on PYTHONPATH=DIR (an export of an earlier commit), so the
two are measured in one run and reported as ratios. The SuperNodes run stock Flower's ClientApp
mode by default (`--isolation subprocess`: a SuperExec per node polling once a second), not
hacfed's runner, whose 50 ms poll of its own SuperNode is nothing on a lab's machine but 64 x 20
calls a second on one 2-core machine; neither touches the SuperLink, whose load is the same.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from hacfed.clients.supernode import start_supernode
from hacfed.procs import ProcessSupervisor
from hacfed.server.superlink import start_superlink

_REQUESTS = ("[Fleet.PullMessages] node_id=", "[Fleet.SendNodeHeartbeat]")  # one line per request each


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` (/proc/PID/stat, fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def count_requests(text: str) -> dict[str, int]:
    """How many of each Fleet request the SuperLink's DEBUG log `text` names."""
    return {name: text.count(name) for name in _REQUESTS}


def measure(labs: int, window_s: float, settle_s: float, pythonpath: str | None,
            isolation: str) -> dict[str, float]:
    previous = os.environ.get("PYTHONPATH")
    with tempfile.TemporaryDirectory(prefix="hacfed-idle-") as tmp, ProcessSupervisor() as sup:
        link = start_superlink(sup, Path(tmp) / "link", extra_env={"FLWR_LOG_LEVEL": "DEBUG"})
        if pythonpath is not None:
            os.environ["PYTHONPATH"] = pythonpath  # the SuperNodes' environment (`flower_env` copies it)
        try:
            for i in range(labs):
                start_supernode(sup, Path(tmp) / f"lab-{i}", superlink_address=link.fleet_address,
                                node_config={"participant-id": f"lab-{i}", "participant-address": "unix:/nonexistent"},
                                isolation=isolation, ready_timeout_s=300.0)
        finally:
            if previous is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = previous
        time.sleep(settle_s)
        log_path = Path(tmp) / "link" / "superlink.log"
        pid = link.process.pid
        start_log, start_cpu, start = log_path.read_text(errors="replace"), cpu_seconds(pid), time.monotonic()
        time.sleep(window_s)
        end_log, end_cpu, elapsed = log_path.read_text(errors="replace"), cpu_seconds(pid), time.monotonic() - start
    before, after = count_requests(start_log), count_requests(end_log)
    pulls = (after[_REQUESTS[0]] - before[_REQUESTS[0]]) / elapsed
    beats = (after[_REQUESTS[1]] - before[_REQUESTS[1]]) / elapsed
    return {"pulls_per_s": pulls, "heartbeats_per_s": beats, "cpu_fraction": (end_cpu - start_cpu) / elapsed}


def main() -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--labs", type=int, default=64)
    parser.add_argument("--window-s", type=float, default=30.0)
    parser.add_argument("--settle-s", type=float, default=10.0)
    parser.add_argument("--baseline", metavar="DIR", default=None,
                        help="first measure SuperNodes run from the hacfed package on PYTHONPATH=DIR")
    parser.add_argument("--isolation", choices=("subprocess", "runner"), default="subprocess")
    args = parser.parse_args()
    if args.labs < 1 or args.window_s <= 0 or args.settle_s < 0:
        parser.error("--labs must be >= 1, --window-s > 0 and --settle-s >= 0")
    runs = ([("baseline", args.baseline)] if args.baseline else []) + [("current", None)]
    results = {label: measure(args.labs, args.window_s, args.settle_s, path, args.isolation) for label, path in runs}
    for label, r in results.items():
        print(f"{label}: {args.labs} idle labs, SuperLink {r['pulls_per_s']:.1f} pulls/s, "
              f"{r['heartbeats_per_s']:.1f} heartbeats/s, CPU {100 * r['cpu_fraction']:.1f} % of a core")
    if "baseline" in results:
        base, cur = results["baseline"], results["current"]
        print(f"current / baseline: pulls/s {cur['pulls_per_s'] / max(base['pulls_per_s'], 1e-9):.2f}x, "
              f"CPU {cur['cpu_fraction'] / max(base['cpu_fraction'], 1e-9):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
