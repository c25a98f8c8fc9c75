"""R3 and R4 at the sizes their rows state (security.md): 4 labs, quorum 3, a 5 s round deadline.

Real hacfed-server and hacfed-client processes on loopback (the fault suite's `Federation`). Once a
round has closed with all four labs:

- R4, the straggler: lab-b takes in its task and its whole tree (hacfed-client, SuperNode, ClientApp
  runner) is stopped with SIGSTOP before its submission is written. The round closes by deadline,
  at most 1 s after it (the journal's `closed_at - deadline`), with the other three, and the next
  round opens. After SIGCONT lab-b sends that submission late and gets HACFED-E-ROUND-CLOSED; the
  closed round's journal rows stay exactly as they were at its close.
- R3, the dropout: once all four contribute again, lab-c's hacfed-client is SIGKILLed right after
  it took in its task, before its submission is written (stopped first, so that the kill cannot
  land after the step). The round closes by deadline, at most 1 s after it, with the other three,
  and the next round opens. lab-c is started again with the same command (the same state dir: the
  same key) and the coordinator binds it again ("rejoined: lab-c") within 2 of Flower's SuperNode
  heartbeat intervals (`flwr.common.constant.HEARTBEAT_DEFAULT_INTERVAL`, 30 s) of the restart, the
  lab's model load included; it then contributes to a round that all four close by quorum.

Under load a healthy lab can miss the 5 s deadline as well; that round closes after an extension
with fewer labs and is no trial of the row, so the fault is made again in a later round
(`_a_fair_trial`, up to TRIALS times): every check above holds for the round that is the trial, and
the test waits on what the labs and the coordinator do, not on the machine being fast enough once.
On a loaded machine this test also found the coordinator hanging after lab-c's restart: the restart
stopped lab-c's old SuperNode between its reply's metadata and content, and the ServerApp waited for
that content for 2 h (fixed: hacfed.flower_pulls, `reply_content_wait_s`).

tests/faults/test_dropout_straggler.py runs the same faults with 3 labs and a 25 s deadline, which
stays green on a loaded CI machine; this test checks the rows' own numbers.
"""

from __future__ import annotations

import signal
import time

import pytest
from flwr.common.constant import HEARTBEAT_DEFAULT_INTERVAL

from tests.faults.conftest import fault_toml
from tests.faults.test_dropout_straggler import _round_rows, _wait_closed
from tests.federation import TRACE, Federation

pytestmark = pytest.mark.slow

LABS = ("lab-a", "lab-b", "lab-c", "lab-d")
DEADLINE_S = 5.0
CLOSE_SLACK_S = 1.0  # R3: the round closes within deadline + 1 s
ROUNDS = 1000  # never reached: the test stops the federation once lab-c is back (a loaded machine joins late)
REJOIN_S = 2 * HEARTBEAT_DEFAULT_INTERVAL
# A busy machine can make a healthy lab miss the 5 s deadline too: such a round is no trial of R3/R4
# (`_a_fair_trial`), and the fault is made again in a later round, up to TRIALS times; a round with all
# four (the healthy state the faults start from) is waited for over up to ALL_FOUR_TRIES rounds.
TRIALS = 4
ALL_FOUR_TRIES = 40


def _all_four(fed: Federation, server, first: int, tries: int = 8) -> int:
    """The first round from `first` on that closed with all four labs."""
    for round_id in range(first, first + tries):
        if _wait_closed(fed, server, round_id)[2] == list(LABS):
            return round_id
    raise AssertionError(f"no round of {first}..{first + tries - 1} closed with all four:\n{server.text()[-3000:]}")


def _freeze_after_receiving(fed: Federation, pid: str, first: int, whole_tree: bool) -> int:
    """Stop `pid` (its whole tree, or its hacfed-client only) right after it took in a round's task,
    before its submission for that round is written; returns that round."""
    proc = fed.labs[pid]
    for round_id in range(first, first + 6):
        fed.wait_received(pid, round_id)
        if whole_tree:
            fed.signal_tree(proc, signal.SIGSTOP)
        else:
            fed.remember(proc)
            proc.popen.send_signal(signal.SIGSTOP)
        if not any(e["round_id"] == round_id for e in fed.outbox(pid)):
            return round_id
        if whole_tree:  # its step was quicker than the stop: let it go and try the next round
            fed.signal_tree(proc, signal.SIGCONT)
        else:
            proc.popen.send_signal(signal.SIGCONT)
    raise AssertionError(f"{pid} submitted before every SIGSTOP landed")


def _a_fair_trial(fed: Federation, server, round_id: int, labs: list[str]) -> bool:
    """Whether the round closed by deadline with exactly `labs`, the ones not frozen or killed. A round
    where the machine made one of them miss the 5 s deadline too tests nothing of R3/R4 (it closes
    after an extension, with fewer): the caller lets it go and tries the fault again."""
    reason, _, contributors = _wait_closed(fed, server, round_id)
    (opened, deadline), = fed.rows("SELECT opened_at, deadline FROM rounds WHERE round_id=?", round_id)
    extended = deadline - opened > DEADLINE_S + 1e-6  # one of `labs` missed the first deadline (seen in CI)
    if (reason, contributors) == ("deadline", labs) and not extended:
        return True
    assert extended or set(contributors) < set(labs) or reason == "quorum", (round_id, reason, contributors)
    return False


def _closed_by_deadline_with(fed: Federation, server, round_id: int, labs: list[str]) -> float:
    """The round closed by deadline with `labs`, within the slack; the next round opened. Returns
    how long after its deadline it closed."""
    reason, _, contributors = _wait_closed(fed, server, round_id)
    assert (reason, contributors) == ("deadline", labs), server.text()[-3000:]
    (opened, deadline, closed), = fed.rows("SELECT opened_at, deadline, closed_at FROM rounds WHERE round_id=?",
                                           round_id)
    assert deadline - opened == pytest.approx(DEADLINE_S)
    late = closed - deadline
    assert 0.0 <= late <= CLOSE_SLACK_S, (round_id, late)
    fed.console(server, rf"round {round_id + 1} open: ", timeout=30)  # the next round started
    assert fed.rows("SELECT state FROM rounds WHERE round_id=?", round_id + 1) != []
    return late


def test_four_labs_quorum_three_a_5s_deadline_survive_a_straggler_and_a_dropout(federation: Federation) -> None:
    fed = federation
    fed.configure(fault_toml("faults-rows", rounds=ROUNDS, expected=4, minimum=3, deadline_s=DEADLINE_S))
    server = fed.start(LABS)
    healthy = _all_four(fed, server, 0, tries=40)  # a lab that loads its model late joins a few rounds in

    # -- R4: lab-b freezes after taking in its task (again, should the machine make another lab late too)
    straggled = healthy
    for _ in range(TRIALS):
        straggled = _freeze_after_receiving(fed, "lab-b", straggled + 1, whole_tree=True)
        if _a_fair_trial(fed, server, straggled, ["lab-a", "lab-c", "lab-d"]):
            break
        fed.signal_tree(fed.labs["lab-b"], signal.SIGCONT)
        straggled = _all_four(fed, server, straggled + 1, tries=ALL_FOUR_TRIES)
    else:
        raise AssertionError(f"no fair straggler round in {TRIALS} tries:\n{server.text()[-3000:]}")
    late_r4 = _closed_by_deadline_with(fed, server, straggled, ["lab-a", "lab-c", "lab-d"])
    closed = _round_rows(fed, straggled)
    fed.signal_tree(fed.labs["lab-b"], signal.SIGCONT)
    fed.console(fed.labs["lab-b"], rf"round {straggled}: REFUSED HACFED-E-ROUND-CLOSED: ", timeout=120)
    fed.console(server, rf"round {straggled} \(resent from the outbox\) lab-b: REFUSED HACFED-E-ROUND-CLOSED")
    assert [(e["state"], e["code"]) for e in fed.outbox("lab-b") if e["round_id"] == straggled] == [
        ("refused", "HACFED-E-ROUND-CLOSED")]
    assert _round_rows(fed, straggled) == closed

    # -- R3: lab-c dies after taking in its task (again, should the machine make another lab late too)
    again = _all_four(fed, server, straggled + 1, tries=ALL_FOUR_TRIES)
    key = (fed.tmp / "lab-c" / "participant.pub").read_bytes()
    for trial in range(TRIALS):
        dropped = _freeze_after_receiving(fed, "lab-c", again + 1, whole_tree=False)
        fed.kill(fed.labs["lab-c"])
        fair = _a_fair_trial(fed, server, dropped, ["lab-a", "lab-b", "lab-d"])
        if fair:
            late_r3 = _closed_by_deadline_with(fed, server, dropped, ["lab-a", "lab-b", "lab-d"])

        restarted, since = time.monotonic(), len(server.text())
        lab_c = fed.lab("lab-c", log=f"lab-c-{trial + 2}.log")  # the same command
        fed.console(lab_c, r"using this lab's keys")
        assert (fed.tmp / "lab-c" / "participant.pub").read_bytes() == key
        # Rejoined: its first accepted submission after the restart. The driver prints "rejoined: lab-c"
        # only when its Flower node was seen gone first, which a quick restart can beat.
        back_in = int(fed.console(server, r"round (\d+) lab-c: submitted \d+ trajectories, accepted [1-9]",
                                  timeout=REJOIN_S + 60, since=since).group(1))
        rejoin_s = time.monotonic() - restarted
        assert rejoin_s <= REJOIN_S, f"lab-c rejoined {rejoin_s:.1f}s after its restart"
        again = _all_four(fed, server, back_in, tries=ALL_FOUR_TRIES)
        if fair:
            break
    else:
        raise AssertionError(f"no fair dropout round in {TRIALS} tries:\n{server.text()[-3000:]}")
    server.stop()
    assert server.popen.returncode == 0, server.text()[-3000:]

    assert _round_rows(fed, straggled) == closed
    assert fed.integrity() == "ok"
    rejections = fed.rows("SELECT participant_id, round_id, code FROM rejections WHERE round_id > ?", healthy)
    assert ("lab-b", straggled, "HACFED-E-ROUND-CLOSED") in rejections
    assert {c for _, _, c in rejections} <= {"HACFED-E-ROUND-CLOSED", "HACFED-E-STALE-ROUND"}, rejections
    fed.check_receipts_in_journal(list(LABS), complete=False)
    for proc in fed.procs:
        assert not TRACE.search(proc.text()), proc.name
    print(f"\nR4 round {straggled} closed {late_r4:.2f}s after its deadline; R3 round {dropped} {late_r3:.2f}s after; "
          f"lab-c rejoined {rejoin_s:.1f}s after its restart, contributed again in round {back_in}")
