"""The Flower internals hacfed's exchange still touches, pinned: each test fails on a flwr upgrade that
changes what hacfed relies on, instead of the lab silently running slower or not at all.

- `hacfed.clients.supernode._speed_up` caps the sleeps of flwr 1.32's SuperNode loop (its fixed 3 s
  after an empty pull and 0.5 s while waiting for a reply); flwr has no option for either.
- `hacfed.clients.clientapp_runner` speaks the ClientAppIo API of a SuperNode started with
  `--isolation process`, with flwr's pull/push helpers, and learns the API's bound address from flwr's
  log line.
"""

from __future__ import annotations

import inspect
import time

import flwr
import flwr.supernode.start_client_internal as loop_module
import pytest
from flwr.proto.clientappio_pb2_grpc import ClientAppIoStub

from hacfed.clients import supernode


def test_flwr_is_the_version_these_pins_were_checked_against() -> None:
    # Not a pin by itself: when it fails, re-read the tests below against the new flwr and bump it.
    assert flwr.__version__.startswith("1.32."), flwr.__version__


def test_supernode_loop_sleeps_through_the_module_time_the_cap_replaces() -> None:
    loop = inspect.getsource(loop_module.start_client_internal)
    push = inspect.getsource(loop_module._push_messages)
    assert "time.sleep(3)" in loop  # the idle sleep after an empty pull
    assert "time.sleep(0.5)" in push  # the wait for the ClientApp's reply
    assert loop_module.time is time  # a module global: `_speed_up` swaps it for the capped one


def test_speed_up_caps_every_sleep_of_the_loop_module_and_a_finished_task_ends_it(monkeypatch) -> None:
    class FakeLoop:
        time = time
        _make_fleet_connection_retry_invoker = staticmethod(lambda *a, **kw: None)
        _pull_and_store_message = staticmethod(lambda message: message)  # the run id, or None when empty

        @staticmethod
        def start_client_internal() -> None:
            time.sleep(3)

    class RecordingEvent:
        def __init__(self, fired: bool) -> None:
            self.fired, self.timeouts, self.cleared = fired, [], 0

        def wait(self, timeout: float) -> bool:
            self.timeouts.append(timeout)
            return self.fired

        def clear(self) -> None:
            self.cleared += 1

    fake = FakeLoop()
    supernode._speed_up(fake, 0.2)  # type: ignore[arg-type]
    assert fake.time.monotonic is time.monotonic  # everything but sleep is the real module
    idle = RecordingEvent(fired=False)
    monkeypatch.setattr(supernode, "_REPLY_READY", idle)
    fake.time.sleep(3)
    fake.time.sleep(0.05)
    assert idle.timeouts == [0.2, 0.05] and idle.cleared == 0  # capped, never longer than asked
    woken = RecordingEvent(fired=True)  # the runner stored a reply: the sleep ends and re-arms
    monkeypatch.setattr(supernode, "_REPLY_READY", woken)
    fake.time.sleep(0.5)
    assert woken.timeouts == [0.2] and woken.cleared == 1


def test_speed_up_pulls_quickly_after_a_message_and_wakes_the_runner(monkeypatch) -> None:
    class FakeLoop:
        time = time
        _make_fleet_connection_retry_invoker = staticmethod(lambda *a, **kw: None)
        _pull_and_store_message = staticmethod(lambda message: message)

        @staticmethod
        def start_client_internal() -> None:
            time.sleep(3)

    timeouts: list[float] = []

    class NeverFired:
        def wait(self, timeout: float) -> bool:
            timeouts.append(timeout)
            return False

    stored = supernode.threading.Event()
    monkeypatch.setattr(supernode, "_REPLY_READY", NeverFired())
    monkeypatch.setattr(supernode, "_MESSAGE_STORED", stored)
    fake = FakeLoop()
    supernode._speed_up(fake, 0.5)  # type: ignore[arg-type]
    assert fake._pull_and_store_message(None) is None and not stored.is_set()
    fake.time.sleep(3)
    assert fake._pull_and_store_message(42) == 42 and stored.is_set()  # the runner claims its task at once
    fake.time.sleep(0.5)  # waiting for the reply: capped at the idle interval
    for _ in range(3):
        fake._pull_and_store_message(None)
        fake.time.sleep(3)
    assert timeouts[:2] == [0.5, 0.5]
    burst = supernode.BURST_POLL_S
    assert timeouts[2:] == pytest.approx([burst, burst * supernode.BURST_GROWTH, burst * supernode.BURST_GROWTH ** 2])


def test_idle_polls_speed_up_after_a_message_and_back_off_to_the_idle_interval() -> None:
    polls = supernode.IdlePolls(0.5, burst_s=0.1, growth=2.0)
    assert [polls.sleep_s() for _ in range(2)] == [0.5, 0.5]  # idle: as before
    polls.pulled(True)
    assert [polls.sleep_s() for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    polls.pulled(False)  # an empty pull does not restart the burst
    assert polls.sleep_s() == 0.5
    with pytest.raises(ValueError, match="burst_s must be in"):
        supernode.IdlePolls(0.5, burst_s=0.6)
    with pytest.raises(ValueError, match="growth must be > 1, got 1"):
        supernode.IdlePolls(0.5, growth=1)


def test_process_isolation_starts_no_superexec_and_logs_the_bound_clientappio_address() -> None:
    source = inspect.getsource(loop_module.start_client_internal)
    # The SuperExec (and with it a flwr-clientapp process per message) only starts in subprocess mode.
    guard = source.index("if isolation == ISOLATION_MODE_SUBPROCESS:\n        # `bound_address`")
    assert source.index('command = ["flower-superexec"]') > guard
    appio = inspect.getsource(loop_module.run_clientappio_api_grpc)
    assert f'"Flower Deployment Runtime: {supernode._APPIO_LINE} %s", address' in appio


def test_flower_supernode_cli_takes_process_isolation() -> None:
    from flwr.supernode.cli.flower_supernode import _parse_args_run_supernode

    args = _parse_args_run_supernode().parse_args(
        ["--insecure", "--superlink", "127.0.0.1:1", "--isolation", "process", "--clientappio-api-address",
         "127.0.0.1:0"])
    assert args.isolation == "process" and args.clientappio_api_address == "127.0.0.1:0"


def test_clientappio_api_has_the_calls_the_runner_makes() -> None:
    for rpc in ("PullPendingTasks", "ClaimTask", "PullTaskInput", "PullMessages", "PullObject",
                "ConfirmMessageReceived", "PushMessages", "PushObject", "PushTaskOutput", "SendTaskHeartbeat"):
        assert rpc in inspect.getsource(ClientAppIoStub.__init__), rpc


def test_flwr_helpers_the_runner_uses_keep_their_signatures() -> None:
    from flwr.supercore.inflatable.inflatable_utils import pull_and_inflate_object_from_tree
    from flwr.supernode.runtime.run_clientapp import push_message, push_task_output

    assert list(inspect.signature(push_message).parameters) == ["stub", "message", "context"]
    assert list(inspect.signature(push_task_output).parameters) == ["stub", "context", "sub_status", "details"]
    pull = inspect.signature(pull_and_inflate_object_from_tree).parameters
    assert {"initial_backoff", "backoff_cap", "return_type"} <= set(pull)


def test_content_pulls_of_supernode_and_serverapp_get_the_short_first_retry(monkeypatch) -> None:
    import functools

    import pytest
    from flwr.supercore.inflatable import inflatable_utils
    from flwr.superlink.grid import grpc_grid

    from hacfed.flower_pulls import FIRST_RETRY_S, MAX_RETRY_WAIT_S, shorten_pull_retries

    for module, reader in ((loop_module, loop_module._pull_and_store_message),
                           (grpc_grid, grpc_grid.GrpcGrid.pull_messages)):
        monkeypatch.setattr(module, "pull_objects", module.pull_objects)  # restored after the test
        assert module.pull_objects is inflatable_utils.pull_objects  # flwr's, called by name from `reader`
        shorten_pull_retries(module, [reader])
        shorten_pull_retries(module, [reader])  # twice is once
        quick = module.pull_objects
        assert isinstance(quick, functools.partial) and quick.func is inflatable_utils.pull_objects
        assert quick.keywords == {"initial_backoff": FIRST_RETRY_S, "backoff_cap": MAX_RETRY_WAIT_S,
                                  "max_tries_per_object": None}
    defaults = inspect.signature(inflatable_utils.pull_objects).parameters
    assert defaults["initial_backoff"].default == 1  # what this replaces: a 1 s first retry
    assert defaults["max_time"].default == 7200  # what still bounds a slow pull
    with pytest.raises(RuntimeError, match="no longer calls pull_objects"):
        monkeypatch.setattr(grpc_grid, "pull_objects", inflatable_utils.pull_objects)
        shorten_pull_retries(grpc_grid, [grpc_grid.GrpcGrid.push_messages])
