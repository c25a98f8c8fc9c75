"""hacfed's resident ClientApp runner against a real ClientAppIo API (flwr's own servicer and NodeState,
in this process), filled the way a SuperNode fills it: a stored message and a ClientApp task."""

from __future__ import annotations

import hashlib
import io
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.app.message import make_message
from flwr.app.metadata import Metadata
from flwr.common.constant import ErrorCode
from flwr.supercore.constant import TaskType
from flwr.supercore.fab import Fab
from flwr.supercore.inflatable.inflatable_object import iterate_object_tree
from flwr.supercore.inflatable.inflatable_utils import inflate_object_from_contents
from flwr.supercore.object_store import ObjectStoreFactory
from flwr.supercore.run import Run
from flwr.supernode.nodestate import NodeStateFactory
from flwr.supernode.start_client_internal import _insert_message, run_clientappio_api_grpc

from hacfed.clients.clientapp import app
from hacfed.clients.clientapp_runner import HACFED_CLIENTAPP, TaskOutcome, bundle_clientapp, serve_tasks
from hacfed.clients.relay import serve_participant

APP_PYPROJECT = Path(__file__).resolve().parents[2] / "server" / "flower_app" / "pyproject.toml"
NODE_ID, RUN_ID = 7, 42


def _fab(clientapp: str = HACFED_CLIENTAPP) -> bytes:
    text = APP_PYPROJECT.read_text(encoding="utf-8").replace(f'clientapp = "{HACFED_CLIENTAPP}"',
                                                            f'clientapp = "{clientapp}"')
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as archive:
        archive.writestr("pyproject.toml", text)
    return buf.getvalue()


@dataclass
class Node:
    """The SuperNode's half: its ClientAppIo server, state and object store."""

    address: str
    state: object
    store: object

    def deliver(self, payload: bytes, fab: bytes, participant_port: int) -> str:
        """Store one `train.exchange` message and its task, as the SuperNode does after a pull."""
        fab_hash = hashlib.sha256(fab).hexdigest()
        run = Run.create_empty(RUN_ID)
        run.fab_hash, run.fab_id, run.fab_version = fab_hash, "hacfed/hacfed-app", "0.1.0"
        self.state.store_run(run)
        self.state.store_fab(Fab(fab_hash, fab, {}))
        node_config = {"participant-id": "lab-a", "participant-address": f"127.0.0.1:{participant_port}"}
        self.state.set_run_series_context(run.series_id, Context(
            run_id=RUN_ID, node_id=NODE_ID, node_config=node_config, state=RecordDict(),
            run_config={"relay-timeout-s": 10.0}))
        metadata = Metadata(run_id=RUN_ID, message_id="", src_node_id=1, dst_node_id=NODE_ID, reply_to_message_id="",
                            group_id="1", created_at=time.time(), ttl=60.0, message_type="train.exchange")
        message = make_message(metadata=metadata, content=RecordDict({"hacfed": ConfigRecord({"payload": payload})}))
        _insert_message(message, self.state, self.store)
        assert self.state.create_task(task_type=TaskType.CLIENT_APP, run_id=RUN_ID, fab_hash=fab_hash) is not None
        return message.metadata.message_id

    def reply(self) -> Message:
        [reply] = self.state.get_messages(is_reply=True)
        tree = self.store.get_object_tree(reply.metadata.message_id)
        contents = {t.object_id: self.store.get(t.object_id) for t in iterate_object_tree(tree)}
        return inflate_object_from_contents(tree.object_id, contents, keep_object_contents=False)


@pytest.fixture
def node() -> Iterator[Node]:
    objects = ObjectStoreFactory()
    states = NodeStateFactory(objectstore_factory=objects)
    server = run_clientappio_api_grpc(address="127.0.0.1:0", state_factory=states, objectstore_factory=objects,
                                      certificates=None, superexec_auth_secret=None)
    state = states.state()
    state.set_node_id(NODE_ID)
    try:
        yield Node(server.bound_address, state, objects.store())
    finally:
        server.stop(0).wait()


@pytest.fixture
def participant() -> Iterator[tuple[int, list[bytes]]]:
    seen: list[bytes] = []

    def handle(request: bytes) -> bytes:
        seen.append(request)
        return b"echo:" + request[::-1]

    server, port = serve_participant(handle)
    try:
        yield port, seen
    finally:
        server.stop(0).wait()


def _serve_one(address: str) -> TaskOutcome:
    """Run the runner until it has finished one task (generous limit for a busy machine)."""
    stop, outcomes = threading.Event(), []
    thread = threading.Thread(target=serve_tasks, args=(address, app, stop),
                              kwargs={"poll_s": 0.02, "on_task": lambda o: (outcomes.append(o), stop.set())})
    thread.start()
    thread.join(60.0)
    stop.set()
    thread.join(10.0)
    assert not thread.is_alive()
    [outcome] = outcomes
    return outcome


def test_runner_relays_a_task_to_the_participant_and_stores_the_reply(node: Node, participant) -> None:
    port, seen = participant
    message_id = node.deliver(b"\x00abc", _fab(), port)
    outcome = _serve_one(node.address)
    assert outcome.ok and outcome.message_type == "train.exchange", outcome
    assert seen == [b"\x00abc"]
    reply = node.reply()
    assert reply.metadata.reply_to_message_id == message_id
    record = reply.content["hacfed"]
    assert record["payload"] == b"echo:cba\x00"
    assert record["participant-id"] == "lab-a"
    assert record["relay-torch-loaded"] == ("torch" in sys.modules)  # reported from the runner's process (this one)
    assert node.state.get_tasks(statuses=["pending"]) == []  # claimed, not left for anyone else


def test_runner_refuses_a_bundle_that_names_another_clientapp(node: Node, participant) -> None:
    port, seen = participant
    node.deliver(b"abc", _fab("evil.module:app"), port)
    outcome = _serve_one(node.address)
    assert not outcome.ok
    assert "'evil.module:app'" in outcome.detail
    reply = node.reply()
    assert reply.has_error() and reply.error.code == ErrorCode.LOAD_CLIENT_APP_EXCEPTION
    assert seen == []  # the participant was never called


def test_bundle_clientapp_reads_the_component() -> None:
    assert bundle_clientapp(_fab()) == HACFED_CLIENTAPP
    assert bundle_clientapp(_fab("x.y:z")) == "x.y:z"


def test_serve_tasks_refuses_bad_settings() -> None:
    with pytest.raises(ValueError, match="poll_s must be > 0, got 0"):
        serve_tasks("127.0.0.1:1", app, threading.Event(), poll_s=0)
    with pytest.raises(ValueError, match="loopback"):
        serve_tasks("10.0.0.1:1", app, threading.Event())


def test_a_task_whose_content_never_comes_is_given_up_and_the_next_one_runs(node: Node, participant) -> None:
    """The SuperLink died while the SuperNode pulled a message: its task exists, its content never will.
    The runner gives it up after content_wait_s, so the new run's messages are not blocked behind it."""
    port, seen = participant
    lost = node.deliver(b"lost", _fab(), port)
    tree = node.store.get_object_tree(lost)
    for t in iterate_object_tree(tree):
        node.store.delete(t.object_id)
    node.store.preregister(RUN_ID, tree)  # known ids without content: "not available yet", for ever
    stop, outcomes = threading.Event(), []

    def on_task(outcome: TaskOutcome) -> None:
        outcomes.append(outcome)
        if len(outcomes) == 1:
            node.deliver(b"next", _fab(), port)  # what the restarted coordinator sends next
        else:
            stop.set()

    thread = threading.Thread(target=serve_tasks, args=(node.address, app, stop),
                              kwargs={"poll_s": 0.02, "on_task": on_task, "content_wait_s": 1.0})
    thread.start()
    thread.join(120.0)
    stop.set()
    thread.join(10.0)
    assert not thread.is_alive()
    first, second = outcomes
    assert not first.ok and "ObjectUnavailable" in first.detail, first
    assert second.ok and seen == [b"next"], (second, seen)


def test_content_wait_must_be_positive() -> None:
    with pytest.raises(ValueError, match="content_wait_s must be > 0, got 0"):
        serve_tasks("127.0.0.1:1", app, threading.Event(), content_wait_s=0)


def test_a_stored_message_wakes_the_runner_before_its_next_poll(node: Node, participant) -> None:
    """The SuperNode sets `wake` after storing a message: the task runs at once, not after poll_s (here 60 s)."""
    port, seen = participant
    stop, wake, done = threading.Event(), threading.Event(), threading.Event()
    thread = threading.Thread(target=serve_tasks, args=(node.address, app, stop),
                              kwargs={"poll_s": 60.0, "on_task": lambda _o: done.set(), "wake": wake})
    thread.start()
    try:
        time.sleep(1.0)  # its first (empty) poll is done: it now waits for poll_s or `wake`
        started = time.monotonic()
        node.deliver(b"now", _fab(), port)
        wake.set()
        assert done.wait(30.0), "the woken runner did not run the task"
        assert time.monotonic() - started < 30.0 and seen == [b"now"]
    finally:
        stop.set()
        wake.set()  # the stop is seen after this wait
        thread.join(10.0)
    assert not thread.is_alive()
