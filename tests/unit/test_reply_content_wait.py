"""A reply whose content never arrives does not hold the coordinator's ServerApp (hacfed.flower_pulls).

Found by tests/faults/test_dropout_at_row_sizes.py on a loaded machine: a lab restarted with the same
state dir stops the SuperNode its killed self left running; when that lands between the old
SuperNode's PushMessages and its PushObject, the SuperLink holds a reply whose content never comes,
and flwr's `pull_objects` waited for it for PULL_MAX_TIME (2 h), the ServerApp's only loop with it:
no round closed. The ServerApp's pulls are now bounded by `reply_content_wait_s`, after which Flower
hands the loop an error reply for that lab.
"""

from __future__ import annotations

import functools
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from flwr.supercore.inflatable import inflatable_utils
from flwr.superlink.grid import grpc_grid

from hacfed.flower_pulls import MAX_RETRY_WAIT_S, REPLY_CONTENT_WAIT_S, quick_pull_objects, reply_content_wait_s
from hacfed.server.config import write_server_config
from hacfed.server.driver import make_driver
from tests.unit.test_coordinator_fakes import FakeClock
from tests.unit.test_server_driver import Federation


def test_the_bound_is_the_exchange_timeout_and_at_most_a_minute() -> None:
    assert reply_content_wait_s(5.0) == 5.0
    assert reply_content_wait_s(900.0) == REPLY_CONTENT_WAIT_S == 60.0


class _NoWaitEvent(threading.Event):
    """flwr's retry backoff without the real waits (the fake clock below is the pull's time); records each."""

    waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout or 0.0)
        return self.is_set()


def test_a_pull_whose_content_never_arrives_gives_up_at_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = {"t": 0.0}
    monkeypatch.setattr(inflatable_utils, "time", SimpleNamespace(monotonic=lambda: clock["t"]))
    monkeypatch.setattr(inflatable_utils, "threading", SimpleNamespace(Lock=threading.Lock, Event=_NoWaitEvent))

    def never_there(object_id: str) -> bytes:
        clock["t"] += 7.0  # each try: 7 s of (fake) time
        if clock["t"] > 10 * 60.0:  # far past any bound: stop a pull that has none (flwr's is 2 h)
            raise RuntimeError("still waiting")
        raise inflatable_utils.ObjectUnavailableError(object_id)

    with pytest.raises(inflatable_utils.ObjectUnavailableError):
        quick_pull_objects(max_time_s=60.0)(["a" * 64], never_there)
    assert 60.0 <= clock["t"] < 60.0 + 2 * 7.0
    clock["t"] = 0.0
    with pytest.raises(RuntimeError, match="still waiting"):  # unbounded, as the SuperNode's pulls stay
        quick_pull_objects()(["a" * 64], never_there)
    assert _NoWaitEvent.waits and max(_NoWaitEvent.waits) <= MAX_RETRY_WAIT_S * 1.2  # hacfed's short retries


def test_the_serverapp_driver_bounds_its_grid_pulls_by_the_round_deadline(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(grpc_grid, "pull_objects", inflatable_utils.pull_objects)  # restored after the test
    for process_wide in ("keep_freed_memory", "freeze_startup_objects"):  # the ServerApp's, not this process's
        monkeypatch.setattr(f"hacfed.server.driver.{process_wide}", lambda: None)
    fed = Federation(tmp_path, FakeClock(), round_deadline_s=5.0)
    path = write_server_config(fed.config, tmp_path / "driver-settings.json")
    make_driver({"driver-config": str(path)})
    pull = grpc_grid.pull_objects
    assert isinstance(pull, functools.partial) and pull.func is inflatable_utils.pull_objects
    assert pull.keywords["max_time"] == 5.0
