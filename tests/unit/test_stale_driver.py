"""The federation driver at max_staleness K = 1 (`hacfed.server.stale_rounds`), with direct calls.

The nodes are real `ParticipantService`s around scripted participants (tests/unit/test_server_driver.py's
`Federation`); each test plays the ServerApp loop by hand: `poll` asks the driver for payloads,
keeps them pending, and answers those of the labs it is told to, so one lab can be held back while
the other runs ahead. What each lab was sent is read from the journal (`sent_steps`, `sent_sources`).
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest

from hacfed.messages import RoundUpdate
from hacfed.server.coordinator.journal import SentStep
from hacfed.server.driver_settings import STATUS_FILE
from hacfed.server.run_end import write_status
from hacfed.wire import encode_round_update
from tests.unit.test_coordinator_fakes import FakeClock
from tests.unit.test_server_driver import Federation

K = 1


class Poller:
    """The ServerApp loop by hand: payloads are kept pending until `answer` hands their replies back."""

    def __init__(self, fed: Federation) -> None:
        self.fed = fed
        self.pending: dict[int, bytes] = {}

    def poll(self, *answer: str) -> dict[int, bytes]:
        """One loop turn (a second on the fake clock): new payloads (kept pending), then the replies
        of the labs `answer` names."""
        self.fed.clock.t += 1.0
        payloads = dict(self.fed.driver.next_round(self.fed.identified()) or {})
        self.pending.update(payloads)
        for node in [n for n in self.pending if self.fed.nodes[n][0] in answer]:
            self.fed.driver.on_replies([(node, self.fed.nodes[node][1].handle(self.pending.pop(node)))])
        self.fed.driver.close_round()
        return payloads

    def steps(self, pid: str) -> list[int | None]:
        """The plan rounds of the updates lab `pid` trained on (None: the final update)."""
        node = next(n for n, (p, _) in self.fed.nodes.items() if p == pid)
        return [u.next_plan.round_id if u.next_plan else None for u in self.fed.nodes[node][1].participant.updates]


def _two_labs(tmp_path: Path, clock: FakeClock | None = None, rounds: int = 4) -> tuple[Federation, Poller]:
    fed = Federation(tmp_path, clock or FakeClock(), rounds=rounds, max_staleness=K)
    fed.add(1, "lab-a")
    fed.add(2, "lab-b")
    return fed, Poller(fed)


def _check_deliveries(fed: Federation, rounds: int) -> None:
    """Every lab was sent every recorded submission of every round exactly once, none older than K
    rounds, and trained on each sample once."""
    _check_sources(fed, rounds)
    journal = fed.driver.journal
    for pid in ("lab-a", "lab-b"):
        node = next(n for n, (p, _) in fed.nodes.items() if p == pid)
        trained = [(t.source_id, t.trajectory_id) for u in fed.nodes[node][1].participant.updates for t in u.pool]
        assert len(trained) == len(set(trained)) == len(journal.pool(0)) * rounds, pid


def _check_sources(fed: Federation, rounds: int) -> None:
    """The journal sent every lab every recorded submission of every round exactly once, none older than
    K rounds."""
    journal = fed.driver.journal
    submitted = {(q, s) for q in range(rounds) for s in journal.submitter_ids(q)}
    for pid in ("lab-a", "lab-b"):
        pairs = []
        for step in (s for s in journal.sent_steps() if s.participant_id == pid):
            for q, sources in step.sources.items():
                assert 0 <= step.step - 1 - q <= K, (pid, step)
                pairs.extend((q, s) for s in sources)
        assert sorted(pairs) == sorted(submitted), pid


def test_the_fast_lab_starts_its_next_step_before_the_round_closes(tmp_path: Path) -> None:
    fed, loop = _two_labs(tmp_path)
    coordinator = fed.driver.coordinator
    assert fed.driver.stale is not None
    loop.poll("lab-a")  # round 0 opens; both are sent step 0; only lab-a replies
    loop.poll("lab-a")  # lab-a may start step 1 at once: its step 0 is in, round -1 needs no close
    assert loop.steps("lab-a") == [0, 1] and loop.steps("lab-b") == []
    assert coordinator.open_rounds() == [0, 1]
    write_status(fed.driver.state_dir, coordinator, False)  # (written at each close and restart)
    status = json.loads((fed.driver.state_dir / STATUS_FILE).read_text())
    assert status["open_rounds"] == [0, 1] and status["open_round"] == 1 and status["next_round"] == 2
    for _ in range(3):  # step 2 waits for round 0, which waits for lab-b
        loop.poll("lab-a")
    assert loop.steps("lab-a") == [0, 1] and coordinator.open_rounds() == [0, 1]
    loop.poll("lab-a", "lab-b")  # lab-b's step 0 reply closes round 0 (quorum)
    assert fed.driver.journal.round(0).close_reason == "quorum"
    loop.poll("lab-a", "lab-b")
    assert loop.steps("lab-a") == [0, 1, 2] and loop.steps("lab-b") == [0, 1]
    for _ in range(30):
        if fed.driver.finished():
            break
        loop.poll("lab-a", "lab-b")
    assert fed.driver.finished(), "\n".join(fed.lines)
    assert loop.steps("lab-a") == loop.steps("lab-b") == [0, 1, 2, 3, None]
    assert [fed.driver.journal.round(q).close_reason for q in range(4)] == ["quorum"] * 4
    _check_deliveries(fed, 4)
    # each round's rows once, when it (the oldest open round) closed, with each lab's own step times
    rows = [r for r in fed.rows() if not r.get("final")]
    assert sorted((r["round"], r["agent"]) for r in rows) == [(q, p) for q in range(4) for p in ("lab-a", "lab-b")]
    assert all(r["time_rollout_s"] == 0.25 for r in rows)
    assert [line.split(" in ")[0] for line in fed.lines if " closed (quorum)" in line] == [
        f"round {q} closed (quorum)" for q in range(4)]
    # lab-a's step 1 went out before round 0 closed, and carried only its own round-0 samples
    a1 = next(s for s in fed.driver.journal.sent_steps() if s.participant_id == "lab-a" and s.step == 1)
    assert a1.sent_at < fed.driver.journal.round(0).closed_at and a1.sources == {0: {"lab-a"}}
    a2 = next(s for s in fed.driver.journal.sent_steps() if s.participant_id == "lab-a" and s.step == 2)
    assert a2.sources == {0: {"lab-b"}, 1: {"lab-a"}}  # lab-b's round 0, one round stale


def test_a_failed_exchange_and_a_restart_resend_the_same_samples(tmp_path: Path) -> None:
    clock = FakeClock()
    fed, loop = _two_labs(tmp_path, clock)
    loop.poll("lab-a")
    sent = loop.poll()  # lab-a's step 1 is built and journaled ...
    assert list(sent) == [1]
    fed.driver.on_error(1, "HACFED-E-PARTICIPANT-UNREACHABLE: down")  # ... and its exchange fails
    loop.pending.pop(1)
    loop.poll("lab-b")  # lab-b's step 0 closes round 0: lab-a's step 1 must not take lab-b's samples now
    clock.t += 5.0
    loop.poll()  # the retry
    first = fed.driver.coordinator.engine.update_for("lab-a", 1).update
    assert {t.source_id for t in first.pool} == {"lab-a"}
    fed.driver.journal.close()  # the ServerApp dies (kill -9) and is started again
    fed.driver, fed.mapped, loop.pending = fed.new_driver(), {}, {}
    again = fed.driver.coordinator.engine.update_for("lab-a", 1).update
    assert [t.trajectory_id for t in again.pool] == [t.trajectory_id for t in first.pool]
    assert again.capabilities == first.capabilities
    for _ in range(40):
        if fed.driver.finished():
            break
        loop.poll("lab-a", "lab-b")
    assert fed.driver.finished(), "\n".join(fed.lines)
    _check_deliveries(fed, 4)
    with sqlite3.connect(fed.driver.config.coordinator.journal_path) as db:
        assert db.execute("SELECT COUNT(*) FROM sent_steps").fetchone() == (2 * 5,)


def test_the_journal_refuses_to_send_a_lab_a_submission_twice(tmp_path: Path) -> None:
    fed, loop = _two_labs(tmp_path)
    loop.poll("lab-a")
    loop.poll("lab-a")  # lab-a's step 1: its own round-0 submission
    journal = fed.driver.journal
    assert journal.sent_step("lab-a", 1).sources == {0: {"lab-a"}}
    with pytest.raises(sqlite3.IntegrityError):
        journal.record_sent_step(SentStep("lab-a", 2, 0.0, None, {0: frozenset({"lab-a", "lab-b"})}))
    assert journal.sent_step("lab-a", 2) is None  # the whole step rolled back


def test_k0_journals_no_deliveries(tmp_path: Path) -> None:
    fed = Federation(tmp_path, FakeClock())
    fed.add(1, "lab-a")
    fed.add(2, "lab-b")
    assert fed.driver.stale is None
    fed.run()
    assert fed.driver.journal.count("sent_steps") == 0


def _received(fed: Federation, pid: str) -> dict[int, RoundUpdate]:
    """The updates lab `pid` trained on, by step (its plan's round; `rounds` for the final update)."""
    node = next(n for n, (p, _) in fed.nodes.items() if p == pid)
    rounds = fed.driver.cfg.rounds
    return {u.next_plan.round_id if u.next_plan else rounds: u for u in fed.nodes[node][1].participant.updates}


def test_an_update_over_the_message_limit_is_cut_to_fit_before_it_is_journaled(tmp_path: Path) -> None:
    """With a message limit that holds a step's own samples but mostly not its peer's too, each update
    that does not fit is cut to fewer peers per prompt (here 0: its own samples only) before its choice
    is journaled; a restart
    rebuilds the same cut update, whatever limit the new driver has; the samples left out are counted
    on the console and never sent later; the run finishes."""
    limit = 904  # the largest update of a plan and 4 own samples; most updates with a peer's samples are larger
    fed, loop = _two_labs(tmp_path)
    fed.driver.stale.max_bytes = limit
    loop.poll("lab-a")
    for _ in range(3):
        loop.poll("lab-a", "lab-b")
    fed.driver.journal.close()  # the ServerApp dies (kill -9) and is started again
    fed.driver, fed.mapped, loop.pending = fed.new_driver(), {}, {}
    fed.driver.stale.max_bytes = limit
    for _ in range(40):
        if fed.driver.finished():
            break
        loop.poll("lab-a", "lab-b")
    assert fed.driver.finished(), "\n".join(fed.lines)
    journal, coordinator = fed.driver.journal, fed.driver.coordinator
    cut = [line for line in fed.lines if "to fit in one message" in line]
    assert cut and all(f"; {limit} available): " in line for line in cut)
    total = len(journal.pool(0)) * 4  # every accepted sample of the run
    for pid in ("lab-a", "lab-b"):
        received = _received(fed, pid)
        assert sorted(received) == [0, 1, 2, 3, 4]
        steps = {s.step: s for s in journal.sent_steps() if s.participant_id == pid}
        for step, update in received.items():
            assert len(encode_round_update(update)) <= limit, (pid, step)
            # what it was sent: the samples of the submissions journaled for the step, only its own ones
            # where the step was cut to 0 peers per prompt
            cut_to_own = steps[step].peers_per_prompt == 0
            chosen = [(t.source_id, t.trajectory_id) for q, sources in sorted(steps[step].sources.items())
                      for t in journal.pool(q) if t.source_id in sources and (t.source_id == pid or not cut_to_own)]
            assert [(t.source_id, t.trajectory_id) for t in update.pool] == chosen, (pid, step)
            rebuilt = coordinator.engine.update_for(pid, step).update  # no limit: the journaled cut is kept
            if step > 0:  # (step 0's P̂ is the tracker's now: it is never sent again once a round closed)
                assert encode_round_update(rebuilt) == encode_round_update(update), (pid, step)
        cut_steps = 0
        for s in steps.values():  # cut only where it drew a peer's samples too, and only to 0 peers here
            peers = {source for sources in s.sources.values() for source in sources} - {pid}
            assert s.peers_per_prompt in (0, fed.driver.cfg.pool_peers_per_prompt), s
            assert peers or s.peers_per_prompt == fed.driver.cfg.pool_peers_per_prompt, s
            cut_steps += s.peers_per_prompt == 0
        assert cut_steps >= 2, (pid, steps)  # the limit cut most of its steps, not one by chance
        trained = [(t.source_id, t.trajectory_id) for u in received.values() for t in u.pool]
        assert len(trained) == len(set(trained))  # a sample left out is never sent later
        left_out = sum(int(re.search(r"(\d+) samples left out", line)[1]) for line in cut if f" for {pid}:" in line)
        assert len(trained) + left_out == total, (pid, len(trained), left_out)
    _check_sources(fed, 4)
