"""R1: the whole coordinator killed with SIGKILL at 50 seeded random moments, restarted each time (long tier).

One federation of two labs (hacfed-server and two hacfed-client processes on loopback). Each life of
hacfed-server runs for a random time (seeded: `SEED`, printed) after its Fleet API is up, from 0 to
`MAX_LIFE_S` seconds, so a kill lands anywhere: while the ServerApp starts or resumes the journal,
during a hello, mid-exchange, while a submission or a round close is written. Then hacfed-server and
everything it started (SuperLink, ServerApp) get SIGKILL, by pid, and hacfed-server is started again
with the same command. After every kill:

- the journal passes `PRAGMA integrity_check`;
- every trajectory a lab holds a signed receipt for is in the journal exactly once, and no lab has
  two submissions in one round (nothing counted twice);
- a round that was open continues with the same id and deadline once the restarted coordinator is
  ready.

Each restart must reach "coordinator ready" (the ServerApp has opened the journal and resumed) within
10 s, the row's goal; the times are printed with their median and maximum. At the end both labs
contribute to a round after the last restart, and every lab's outbox is settled up to that round.

`KILLS` is 50 in the long tier; HACFED_R1_KILLS=N runs N kills instead (a quick check by hand).
The deterministic crash points are tests/faults/test_crash_points.py.
"""

from __future__ import annotations

import os
import random
import statistics
import time

import pytest

from tests.faults.conftest import fault_toml
from tests.federation import TRACE, Federation

pytestmark = [pytest.mark.slow, pytest.mark.long]

LABS = ("lab-a", "lab-b")
KILLS = int(os.environ.get("HACFED_R1_KILLS", "50"))
SEED = int(os.environ.get("HACFED_R1_SEED", "20260531"))
MAX_LIFE_S = 12.0
READY_S = 10.0  # the row: serving again within 10 s of the restart
ROUNDS = 100_000  # never reached: the test stops the coordinator


def _open_round(fed: Federation) -> tuple[int, float] | None:
    rows = fed.rows("SELECT round_id, deadline FROM rounds WHERE state = 'OPEN'")
    assert len(rows) <= 1, rows
    return rows[0] if rows else None


def _after_kill(fed: Federation) -> tuple[int, float] | None:
    """The checks after each kill; the round left open, if any."""
    if not (fed.server_dir / "journal.sqlite").exists():  # killed before the ServerApp created it
        return None
    assert fed.integrity() == "ok"
    fed.check_receipts_in_journal(list(LABS), complete=False)
    twice = fed.rows("SELECT participant_id, round_id FROM submissions GROUP BY participant_id, round_id "
                     "HAVING COUNT(*) > 1")
    assert twice == [], twice
    return _open_round(fed)


def test_fifty_random_kills_of_the_coordinator_lose_and_double_nothing(federation: Federation) -> None:
    fed = federation
    rng = random.Random(SEED)
    fed.configure(fault_toml("faults-random-kills", rounds=ROUNDS, expected=2, minimum=2, deadline_s=600))
    server = fed.start(LABS)
    ready_s: list[float] = []
    resumed = 0
    started = time.monotonic()
    for life in range(1, KILLS + 1):
        time.sleep(rng.uniform(0.0, MAX_LIFE_S))
        fed.kill_tree(server)
        left_open = _after_kill(fed)
        restarted = time.monotonic()
        server = fed.server(f"server-{life + 1}.log")
        ready = fed.console(server, r"coordinator ready \(run faults-random-kills\): ([^\n]*)", timeout=180)
        ready_s.append(time.monotonic() - restarted)
        if left_open is not None:
            round_id, deadline = left_open
            assert ready.group(1).startswith(f"round {round_id} continues (same id and deadline)"), ready.group(0)
            assert fed.rows("SELECT deadline FROM rounds WHERE round_id=?", round_id) == [(deadline,)]
            resumed += 1
    assert max(ready_s) <= READY_S, f"restart to 'coordinator ready' took {max(ready_s):.1f}s"
    since = len(server.text())
    last = int(fed.console(server, r"round (\d+) closed \(\w+\) in [^\n]*; contributors \['lab-a', 'lab-b'\]",
                           timeout=300, since=since).group(1))
    deadline = time.monotonic() + 120
    while any(e["state"] == "pending" and e["round_id"] < last for pid in LABS for e in fed.outbox(pid)):
        assert time.monotonic() < deadline, {pid: fed.outbox(pid) for pid in LABS}
        time.sleep(0.5)
    server.stop()
    assert server.popen.returncode == 0, server.text()[-3000:]

    _after_kill(fed)
    counts = fed.check_receipts_in_journal(list(LABS), complete=False)
    assert fed.rows("SELECT participant_id, code FROM rejections WHERE code NOT IN "
                    "('HACFED-E-ROUND-CLOSED', 'HACFED-E-STALE-ROUND')") == []
    for pid in LABS:
        assert fed.labs[pid].popen.poll() is None, fed.labs[pid].text()[-3000:]
        assert not TRACE.search(fed.labs[pid].text()), pid
    print(f"\n{KILLS} kills (seed {SEED}) in {time.monotonic() - started:.0f}s, {resumed} with a round open; "
          f"restart to 'coordinator ready': median {statistics.median(ready_s):.1f}s, max {max(ready_s):.1f}s "
          f"(goal 10 s); receipted trajectories {counts}; last round {last}")
