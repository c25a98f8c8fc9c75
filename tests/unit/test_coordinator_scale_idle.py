"""The meters of bench/coordinator_scale_idle.py: Fleet requests counted from the SuperLink's log, CPU from /proc."""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "coordinator_scale_idle.py"


def _bench():
    spec = importlib.util.spec_from_file_location("coordinator_scale_idle", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_pull_counts_once_though_flower_logs_it_twice() -> None:
    log = ("INFO :      [Fleet.PullMessages] node_id=7\n"
           "DEBUG :     [Fleet.PullMessages] Request: {'node': {'nodeId': '7'}}\n"
           "DEBUG :     [Fleet.SendNodeHeartbeat] Request: {}\n"
           "INFO :      [Fleet.PullMessages] node_id=8\n")
    pulls, beats = _bench().count_requests(log).values()
    assert (pulls, beats) == (2, 1)


def test_cpu_seconds_grow_with_work() -> None:
    bench = _bench()
    before = bench.cpu_seconds(os.getpid())
    end = time.process_time() + 0.2
    while time.process_time() < end:
        pass
    assert bench.cpu_seconds(os.getpid()) - before >= 0.1
