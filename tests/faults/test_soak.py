"""A soak of the real federation: the coordinator's memory and file descriptors stay bounded
(issue 9; security.md S4's "RSS grows < 50 MiB and the fd count returns to baseline"; R8's 10 min).

hacfed-server and two labs on loopback run tiny rounds back to back for a while: 30 s in the default
run, 10 minutes in the long tier (`./scripts/test.sh --long`); longer on a slow machine, until enough
rounds have closed, within a cap. Every sample interval, psutil sums the resident memory and the
open file descriptors of every process of the coordinator's tree (hacfed-server, SuperLink,
SuperExec, ServerApp, `flwr run`). The baseline is the median of the
first samples, taken once round 1 has closed (every process started, every import done); the end is
the median of the last samples. Growth must stay under generous bounds (RSS 64 MiB and a slope
under 16 MiB/min, 16 fds, 2 processes), with rounds really completing all along; and, as
security.md R8 asks, nothing is refused and every rollout a lab holds a receipt for is in the
journal exactly once. The numbers are printed (`-s`).

`test_mixed_good_and_bad_traffic_keeps_codes_receipts_and_memory` is R8's mixed soak: 4 clients send
good submissions, identical resends and the hostile corpus at a target of 50 requests/s through the
coordinator's round driver in this process (tests/faults/mixed_traffic.py), 45 s by default and 10
minutes in the long tier: only the codes each request may get, every good sample accepted exactly
once, and the RSS slope after the warm-up (a least-squares fit) under a bound.
"""

from __future__ import annotations

import re
import sqlite3
import statistics
import time

import psutil
import pytest

from hacfed.server.coordinator.audit import verify_audit_log
from tests.faults.conftest import fault_toml
from tests.faults.mixed_traffic import run_mixed_soak
from tests.federation import TRACE, Federation

pytestmark = pytest.mark.slow

WINDOW = 8  # samples in the baseline and in the end
MAX_RSS_GROWTH_MIB = 64.0
MAX_FD_GROWTH = 16
MAX_PROC_GROWTH = 2
MAX_RSS_SLOPE_MIB_MIN = 16.0  # security.md R8 asks < 1 MiB/min over 10 minutes; a minute's slope is noisy
CLOSED = re.compile(r"round \d+ closed \(quorum\)")


def _sample(root: int) -> dict[str, tuple[float, int]]:
    """RSS (MiB) and open fds of `root` and each of its descendants, by "name pid"."""
    out = {}
    tree = psutil.Process(root)
    for proc in [tree, *tree.children(recursive=True)]:
        try:
            with proc.oneshot():
                if proc.status() != psutil.STATUS_ZOMBIE:
                    out[f"{proc.name()} {proc.pid}"] = (proc.memory_info().rss / 2**20, proc.num_fds())
        except psutil.NoSuchProcess:
            continue
    return out


def _by_name(sample: dict[str, tuple[float, int]]) -> dict[str, int]:
    return {name.split()[0]: fds for name, (_, fds) in sample.items()}


# (seconds at least, longer until min_rounds rounds have closed (a slow machine), at most max_s;
# seconds between samples): at least 3 * WINDOW samples either way.
@pytest.mark.parametrize(("soak_s", "min_rounds", "max_s", "sample_s"), [
    pytest.param(30.0, 4, 150.0, 0.75, id="30s"),
    pytest.param(600.0, 10, 900.0, 5.0, id="10min", marks=[pytest.mark.long, pytest.mark.timeout(1800)]),
])
def test_soak_keeps_the_coordinators_memory_and_fds_bounded(federation: Federation, soak_s: float, min_rounds: int,
                                                            max_s: float, sample_s: float) -> None:
    fed = federation
    # More rounds than any soak can close: a quiet machine closes one of these in 0.2 s, so 1,000 ran out
    # within minutes and the coordinator ended before the 10-minute soak did.
    fed.configure(fault_toml("faults-soak", rounds=100_000, expected=2, minimum=2, deadline_s=120))
    server = fed.start(("lab-a", "lab-b"))
    fed.console(server, r"round 1 closed", timeout=300)
    samples: list[dict[str, tuple[float, int]]] = []
    times: list[float] = []
    started, before = time.monotonic(), len(CLOSED.findall(server.text()))
    while (elapsed := time.monotonic() - started) < soak_s or len(CLOSED.findall(server.text())) - before < min_rounds:
        assert elapsed < max_s, f"fewer than {min_rounds} rounds in {max_s:.0f}s:\n{server.text()[-3000:]}"
        assert server.popen.poll() is None, server.text()[-3000:]
        times.append(time.monotonic() - started)
        samples.append(_sample(server.popen.pid))
        time.sleep(sample_s)
    rounds = len(CLOSED.findall(server.text())) - before
    server.stop()
    assert server.popen.returncode == 0, server.text()[-3000:]
    assert "hacfed-server: stopped (SystemExit)" in server.text()

    assert len(samples) >= 3 * WINDOW
    rss = [sum(r for r, _ in s.values()) for s in samples]
    fds = [sum(f for _, f in s.values()) for s in samples]
    procs = [len(s) for s in samples]
    base = (statistics.median(rss[:WINDOW]), statistics.median(fds[:WINDOW]), statistics.median(procs[:WINDOW]))
    end = (statistics.median(rss[-WINDOW:]), statistics.median(fds[-WINDOW:]), statistics.median(procs[-WINDOW:]))
    slope = statistics.linear_regression(times, rss).slope * 60.0
    report = (f"soak {times[-1]:.0f}s, {len(samples)} samples, {rounds} rounds closed meanwhile; coordinator "
              f"tree: RSS {base[0]:.1f} -> {end[0]:.1f} MiB (max {max(rss):.1f}, slope {slope:+.2f} MiB/min), "
              f"fds {base[1]:.0f} -> {end[1]:.0f} "
              f"(max {max(fds)}), processes {base[2]:.0f} -> {end[2]:.0f} (max {max(procs)})")
    print(f"\n{report}\nfds by process, first and last sample: {_by_name(samples[0])} -> {_by_name(samples[-1])}")
    assert rounds >= min_rounds, report  # the federation was really working while sampled
    assert end[0] - base[0] < MAX_RSS_GROWTH_MIB, report
    assert end[1] - base[1] <= MAX_FD_GROWTH, report
    assert end[2] - base[2] <= MAX_PROC_GROWTH, report
    assert max(rss) - base[0] < 2 * MAX_RSS_GROWTH_MIB, report
    assert slope < MAX_RSS_SLOPE_MIB_MIN, report

    # -- R8: every good rollout accepted exactly once, nothing refused
    assert fed.rows("SELECT participant_id, round_id, code FROM rejections") == []
    assert fed.integrity() == "ok"
    per_round = fed.rows("SELECT participant_id, round_id, COUNT(*) FROM trajectories "
                         "GROUP BY participant_id, round_id")
    assert per_round and {n for _, _, n in per_round} == {2 * 2}
    fed.check_receipts_in_journal(["lab-a", "lab-b"], complete=False)  # the last receipts may not have arrived
    assert not TRACE.search(server.text())


# ---- R8: mixed good and bad traffic from 4 clients at a target rate (tests/faults/mixed_traffic.py) ------------

MIXED_MAX_SLOPE_MIB_MIN = {"45s": 8.0, "10min": 1.0}  # 45 s: warm-up noise (1.4-3.4 measured); 10 min: R8


@pytest.mark.parametrize(("seconds", "warmup_s", "sample_s"), [
    pytest.param(45.0, 10.0, 0.25, id="45s"),
    pytest.param(600.0, 60.0, 1.0, id="10min", marks=[pytest.mark.long, pytest.mark.timeout(1800)]),
])
def test_mixed_good_and_bad_traffic_keeps_codes_receipts_and_memory(tmp_path, request, seconds: float,
                                                                    warmup_s: float, sample_s: float) -> None:
    """security.md R8: 4 clients send good submissions (and their identical resends) mixed with the
    hostile corpus at 50 requests/s through the coordinator's round driver: no code a request may not
    get, every good sample accepted exactly once, and RSS flat after the warm-up (least-squares slope;
    the numbers are printed with `-s`). The rate is a target: a slow machine reaches less, and says so."""
    result, harness = run_mixed_soak(tmp_path, seconds=seconds, rate=50.0, clients=4, warmup_s=warmup_s,
                                     sample_s=sample_s)
    print(f"\n{result.summary()}")
    tally = result.tally
    assert not tally.unexpected, tally.unexpected[:10]
    assert tally.rounds >= 3 and tally.sent["bad"] >= 3 * tally.sent["good"] / 2 and tally.sent["good+resend"] > 0, \
        result.summary()
    # every good rollout is in the journal exactly once, and nothing of the hostile labs is
    with sqlite3.connect(harness.cfg.journal_path) as db:
        per_round = db.execute("SELECT participant_id, round_id, COUNT(*) FROM trajectories "
                               "GROUP BY participant_id, round_id").fetchall()
        refused_good = db.execute("SELECT COUNT(*) FROM rejections WHERE participant_id LIKE 'good-%'").fetchone()[0]
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert all(pid.startswith("good-") and n == 4 for pid, _, n in per_round), per_round[:10]
    assert sum(n for _, _, n in per_round) == tally.good_accepted
    assert len(per_round) == tally.sent["good"] + tally.sent["good+resend"] and refused_good == 0
    assert verify_audit_log(harness.cfg.audit_path).ok
    assert result.slope_mib_min < MIXED_MAX_SLOPE_MIB_MIN[request.node.callspec.id], result.summary()
