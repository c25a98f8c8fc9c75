"""round_join "newest" over the Flower round driver (docs/staleness.md "Joining the newest round"), with
direct calls: the ServerApp loop played by hand (`test_stale_driver.Poller`) over real
`ParticipantService`s. The fast lab answers every poll, the slow one every fourth: the fast lab runs
ahead, the slow one joins the newest round and skips the others, and each lab is sent every sample at
most once, at most K rounds old, also across a restart of the coordinator."""

from __future__ import annotations

from pathlib import Path

import pytest

from hacfed.server.config import ServerConfig
from tests.unit.test_coordinator_fakes import FakeClock
from tests.unit.test_server_driver import Federation
from tests.unit.test_stale_driver import Poller

K, ROUNDS = 2, 8


def _run(tmp_path: Path, restart_at: int | None = None, a_every: int = 1, b_every: int = 4, k: int = K,
         rounds: int = ROUNDS) -> tuple[Federation, Poller]:
    """lab-a answers every `a_every`-th poll, lab-b every `b_every`-th."""
    fed = Federation(tmp_path, FakeClock(), rounds=rounds, max_staleness=k, round_join="newest")
    fed.add(1, "lab-a")
    fed.add(2, "lab-b")
    loop = Poller(fed)
    assert fed.driver.stale is not None
    for turn in range(200):
        if fed.driver.finished():
            break
        if turn == restart_at:
            fed.driver.journal.close()  # the ServerApp dies (kill -9) and is started again
            fed.driver, fed.mapped, loop.pending = fed.new_driver(), {}, {}
        loop.poll(*[pid for pid, every in (("lab-a", a_every), ("lab-b", b_every)) if turn % every == every - 1])
    assert fed.driver.finished(), "\n".join(fed.lines)
    return fed, loop


def _check_sent(fed: Federation) -> None:
    """Each lab was sent each sample at most once and none older than K rounds (by the journal and by
    what its service trained on); what it trained on is what the journal says it carried."""
    journal = fed.driver.journal
    for node, (pid, service) in fed.nodes.items():
        trained = [(t.source_id, t.trajectory_id) for u in service.participant.updates for t in u.pool]
        assert len(trained) == len(set(trained)), pid
        for update in service.participant.updates:
            step = ROUNDS if update.next_plan is None else update.next_plan.round_id
            for t in update.pool:
                q = int(t.trajectory_id.split("/")[1])
                assert 0 <= step - 1 - q <= K, (pid, step, t.trajectory_id)
        for sent in (s for s in journal.sent_steps() if s.participant_id == pid):
            assert all(0 <= sent.step - 1 - q <= K for q in sent.sources), sent


def _steps(loop: Poller, pid: str) -> list[int]:
    return [ROUNDS if s is None else s for s in loop.steps(pid)]


def test_the_fast_lab_runs_ahead_and_the_slow_one_joins_the_newest_round(tmp_path: Path) -> None:
    fed, loop = _run(tmp_path)
    fast, slow = _steps(loop, "lab-a"), _steps(loop, "lab-b")
    assert fast == list(range(ROUNDS + 1))  # every round and its final update
    assert slow[0] == 0 and slow[-1] == ROUNDS and len(slow) < len(fast)  # it skipped rounds
    assert slow == sorted(set(slow))
    journal = fed.driver.journal
    for q in range(ROUNDS):  # each round waited for the labs that took it, and closed at quorum
        assert journal.submitter_ids(q) == journal.sent_to(q), q
        assert journal.round(q).close_reason == "quorum" and not journal.round(q).below_quorum, q
    # the fast lab was sent step t + 1 while round t was still open (it did not wait for the slow lab)
    ahead = [s.step for s in journal.sent_steps() if s.participant_id == "lab-a" and 0 < s.step < ROUNDS
             and journal.round(s.step - 1).closed_at > s.sent_at]
    assert ahead
    _check_sent(fed)
    # every sample of the slow lab reaches the fast lab (it sends one round per step, none is skipped)
    fast_got = {t.trajectory_id for _, (pid, svc) in fed.nodes.items() if pid == "lab-a"
                for u in svc.participant.updates for t in u.pool if t.source_id == "lab-b"}
    assert fast_got == {t.trajectory_id for q in range(ROUNDS) for t in journal.pool(q) if t.source_id == "lab-b"}


def test_the_slow_lab_joins_the_newest_round_not_the_oldest_it_missed(tmp_path: Path) -> None:
    """lab-a takes a step every 2 polls, lab-b every 8: whenever lab-b is free, lab-a has opened three
    more rounds (K = 3 lets it) and lab-b joins the newest of them, skipping the two before it (the
    oldest round it has not rolled out would be one of those)."""
    fed, loop = _run(tmp_path, a_every=2, b_every=8, k=3, rounds=10)
    assert loop.steps("lab-a") == [*range(10), None]
    assert loop.steps("lab-b") == [0, 3, 6, 9, None]
    assert [fed.driver.journal.submitter_ids(q) for q in (0, 1, 2, 3)] == [{"lab-a", "lab-b"}, {"lab-a"}, {"lab-a"},
                                                                           {"lab-a", "lab-b"}]


def test_a_restarted_coordinator_goes_on_where_the_journal_says(tmp_path: Path) -> None:
    fed, loop = _run(tmp_path, restart_at=9)
    assert _steps(loop, "lab-a")[-1] == ROUNDS and _steps(loop, "lab-b")[-1] == ROUNDS
    _check_sent(fed)


@pytest.mark.parametrize("k", [0, 3])
def test_hacfed_server_takes_round_join_newest_at_any_k(tmp_path: Path, k: int) -> None:
    fed = Federation(tmp_path, FakeClock(), rounds=4, max_staleness=k, round_join="newest")
    assert isinstance(fed.config, ServerConfig) and fed.config.coordinator.round_join == "newest"
    assert fed.driver.stale is not None
