"""R5 on the lab's side: the SuperNode reconnects with 1 s x1.6, jitter, at most 30 s, logs every
attempt, and hacfed-client prints those lines (the coordinator is down, attempt N, reconnected)."""

from __future__ import annotations

import itertools

import grpc
import pytest
from flwr.supercore.retry import make_simple_grpc_retry_invoker

from hacfed.clients.backoff import RECONNECT_MARK, Outage, backoff_delays, install
from hacfed.clients.runner import LogWatcher


def test_delays_grow_by_1_6_up_to_30_seconds_with_bounded_jitter():
    plain = list(itertools.islice(backoff_delays(jitter=0.0), 12))
    assert plain[:4] == pytest.approx([1.0, 1.6, 2.56, 4.096])
    assert max(plain) == 30.0 and plain[-1] == 30.0
    for value in (0.0, 1.0):  # the two extremes of the random source
        jittered = list(itertools.islice(backoff_delays(rng=lambda: value), 12))
        assert all(0.8 * p - 1e-9 <= j <= min(1.2 * p, 30.0) + 1e-9 for p, j in zip(plain, jittered))


class Unavailable(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return "connection refused"


def test_installed_on_flowers_retry_invoker_it_waits_and_logs_each_attempt():
    lines, waits = [], []
    invoker = install(make_simple_grpc_retry_invoker(), out=lines.append, outage=Outage())
    invoker.wait_function = waits.append  # no real sleeping
    calls = iter([Unavailable(), Unavailable(), Unavailable(), "pulled"])

    def target():
        outcome = next(calls)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    assert invoker.invoke(target) == "pulled"
    assert len(waits) == 3 and 0.8 <= waits[0] <= 1.2 and 1.28 <= waits[1] <= 1.92
    assert lines[0].startswith(f"{RECONNECT_MARK} the coordinator is unreachable (UNAVAILABLE); attempt 1 failed, "
                               f"next attempt in")
    assert lines[-1].startswith(f"{RECONNECT_MARK} connected to the coordinator again after 4 attempts")


class Internal(Unavailable):
    def code(self):
        return grpc.StatusCode.INTERNAL  # not retried: Flower's invoker gives the call up


def test_reconnected_is_said_when_another_call_gets_through_first():
    """A restarted SuperLink may end a retrying call with a code that is not retried; the call that gets
    through is then a fresh one, at its first try. The lab must still hear that the coordinator is back."""
    lines: list[str] = []
    outage = Outage(clock=iter([100.0, 107.5]).__next__)
    pull, heartbeat = (install(make_simple_grpc_retry_invoker(), out=lines.append, outage=outage) for _ in range(2))
    for invoker in (pull, heartbeat):
        invoker.wait_function = lambda _s: None
    calls = iter([Unavailable(), Unavailable(), Internal()])

    def failing():
        raise next(calls)

    with pytest.raises(Internal):
        pull.invoke(failing)
    assert [line.split("; ")[1].split(",")[0] for line in lines] == ["attempt 1 failed", "attempt 2 failed"]
    assert heartbeat.invoke(lambda: "ok") == "ok"  # a fresh call, through at its first try
    assert lines[-1] == f"{RECONNECT_MARK} connected to the coordinator again after 3 attempts (7.5s)"
    heartbeat.invoke(lambda: "ok")
    pull.invoke(lambda: "ok")
    assert len(lines) == 3, lines  # said once per outage


def test_the_client_prints_the_supernodes_reconnect_lines(tmp_path):
    log = tmp_path / "supernode.log"
    log.write_text("INFO : old line before the client started\n")
    printed: list[str] = []
    watcher = LogWatcher(log, printed.append)
    with open(log, "a") as fh:
        fh.write(f"WARNING : {RECONNECT_MARK} the coordinator is unreachable (UNAVAILABLE); attempt 1 failed, "
                 f"next attempt in 1.1s\nINFO : something else\nWARNING : Connection attempt failed, retrying in "
                 f"1.10 seconds\n")
    watcher.pump()
    assert printed == [  # flwr's own line after hacfed's is the same attempt: not printed twice
        "the coordinator is unreachable (UNAVAILABLE); attempt 1 failed, next attempt in 1.1s",
    ]
    stock = LogWatcher(log, printed.append)  # a stock flower-supernode logs only its own lines
    with open(log, "a") as fh:
        fh.write("WARNING : Connection attempt failed, retrying in 2.00 seconds\n")
    stock.pump()
    assert printed[-1] == "the coordinator is unreachable; Connection attempt failed, retrying in 2.00 seconds"
    with open(log, "a") as fh:
        fh.write(f"{RECONNECT_MARK} connected to the coordinator again after 2 attem")
    watcher.pump()  # an incomplete line waits for its end
    with open(log, "a") as fh:
        fh.write("pts (1.2s)\n")
    watcher.pump()
    assert printed[-1] == "connected to the coordinator again after 2 attempts (1.2s)"
