"""A long-lived runner of hacfed's ClientApp on a SuperNode's ClientAppIo API (inside the SuperNode process).

Runs on a lab's side, as a thread of the SuperNode process that `hacfed.clients.supernode` starts in
Flower's `--isolation process` mode. There the SuperNode starts no `flower-superexec` and no
`flwr-clientapp`: something else must claim its ClientApp tasks over the ClientAppIo API (gRPC on
127.0.0.1). This is that something, doing in one resident thread what stock Flower does with a
SuperExec (polls every 1 s) and a fresh `flwr-clientapp` process per message (~1 s of interpreter and
import start-up on a busy 2-core machine): it polls the pending tasks every `poll_s`, claims each,
pulls its message and context, calls `hacfed.clients.clientapp.app` directly and pushes the reply and
the task's status back, as `flwr-clientapp` would.

Why it is safe to run in-process: the ClientApp is hacfed's torch-free relay, which keeps no state
between messages (`hacfed.clients.relay`). It runs only that app: a run whose bundle (FAB) names
another ClientApp gets an error reply, so a coordinator cannot make a lab run other code (stock
`flwr-clientapp` would import the bundle's). The Flower pieces it uses (the ClientAppIo stubs and
`flwr.supernode.runtime.run_clientapp`'s pull/push helpers) are pinned by
`tests/unit/test_flower_pins.py`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from logging import ERROR, INFO, WARNING

import grpc
from flwr.app import Context, Error, Message
from flwr.clientapp import ClientApp
from flwr.common.config import get_fab_config
from flwr.common.constant import ErrorCode, SubStatus
from flwr.common.logger import log
from flwr.common.serde import context_from_proto, fab_from_proto, run_from_proto
from flwr.supercore.constant import TaskType
from flwr.supercore.fab import Fab
from flwr.supercore.grpc import create_channel
from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_grpc
from flwr.supercore.inflatable.inflatable_protobuf_utils import (
    make_confirm_message_received_fn_protobuf,
    make_pull_object_fn_protobuf,
)
from flwr.supercore.inflatable.inflatable_utils import pull_and_inflate_object_from_tree
from flwr.supercore.interceptors import AppIoTokenClientInterceptor, RuntimeVersionClientInterceptor
from flwr.supercore.superexec import run_superexec as flwr_superexec
from flwr.supernode.runtime import run_clientapp as flwr_clientapp
from flwr.supernode.runtime.run_clientapp import push_message, push_task_output

from hacfed.clients.rpc_deadline import DeadlineInterceptor
from hacfed.flower_protocol import check_loopback_address
from hacfed.flower_pulls import FIRST_RETRY_S, MAX_RETRY_WAIT_S

# The ClientAppIo stub and request types, as the Flower modules that make these calls (flower-superexec,
# flwr-clientapp) import them: hacfed's own code touches only hacfed's generated protobuf (hacfed.wire).
ClientAppIoStub = flwr_clientapp.ClientAppIoStub
Node, PullAppMessagesRequest, PullTaskInputRequest = (
    flwr_clientapp.Node, flwr_clientapp.PullAppMessagesRequest, flwr_clientapp.PullTaskInputRequest)
ClaimTaskRequest, PullPendingTasksRequest = flwr_superexec.ClaimTaskRequest, flwr_superexec.PullPendingTasksRequest

HACFED_CLIENTAPP = "hacfed.clients.clientapp:app"  # the only ClientApp this runner runs
DEFAULT_POLL_S = 0.05  # a PullPendingTasks on loopback costs well under a millisecond
# How long a claimed task waits for its message's content. Stock Flower waits up to 2 h, which is
# harmless with a process per message, but this runner runs one task at a time: a message whose
# content will never come (the SuperLink was killed while the SuperNode pulled it) would block every
# later message, so after a coordinator restart the lab never saw the new run's hello
# (tests/faults/test_coordinator_outage.py). After this long the task is abandoned: the SuperNode
# answers it with Flower's "ClientApp crashed" once its token expires, and the coordinator resends.
CONTENT_WAIT_S = 120.0
# Every ClientAppIo call of the runner, Flower's helpers' included, has this deadline (they set none;
# security.md R7): each is one loopback round trip to this very process, well under a second.
APPIO_CALL_TIMEOUT_S = 60.0
# The SuperNode creates a task before it has pulled the message's content from the SuperLink, so a
# task claimed at once often finds its content not there yet; flwr's pull would then wait 1 s, 2 s, ...
# (hacfed.flower_pulls: the first retry after 20 ms, waits of at most 0.5 s, flwr's 2 h limit).


@dataclass(frozen=True)
class TaskOutcome:
    """What one claimed task came to (for the log and the tests)."""

    task_id: int
    message_type: str
    ok: bool
    seconds: float
    detail: str = ""


def bundle_clientapp(fab_content: bytes) -> str:
    """The ClientApp reference (`module:attribute`) a run's bundle asks for."""
    components = get_fab_config(fab_content)["tool"]["flwr"]["app"].get("components", {})
    return str(components.get("clientapp", ""))


def pull_task_input(stub: ClientAppIoStub, content_wait_s: float = CONTENT_WAIT_S) -> tuple[Message, Context, Fab]:
    """The claimed task's message, context and bundle: `flwr.supernode.runtime.run_clientapp.pull_task_input`
    with a short retry for content the SuperNode is still pulling (`hacfed.flower_pulls`), for at most
    `content_wait_s` (then flwr's ObjectUnavailableError)."""
    res = stub.PullTaskInput(PullTaskInputRequest())
    context, run, fab = context_from_proto(res.context), run_from_proto(res.run), fab_from_proto(res.fab)
    pulled = stub.PullMessages(PullAppMessagesRequest())
    node = Node(node_id=context.node_id)
    tree = pulled.message_object_trees[0]
    message = pull_and_inflate_object_from_tree(
        tree,
        make_pull_object_fn_protobuf(stub.PullObject, node, run.run_id),
        make_confirm_message_received_fn_protobuf(stub.ConfirmMessageReceived, node, run.run_id),
        return_type=Message, initial_backoff=FIRST_RETRY_S, backoff_cap=MAX_RETRY_WAIT_S, max_tries_per_object=None,
        max_time=content_wait_s,
    )
    message.metadata.__dict__["_message_id"] = tree.object_id  # as flwr-clientapp: the id is not in the content
    return message, context, fab


def run_one_task(
    address: str, token: str, app: ClientApp, task_id: int = 0, content_wait_s: float = CONTENT_WAIT_S,
) -> TaskOutcome:
    """Run the claimed task `token`: pull its input, call `app`, push the reply and the status.

    Mirrors `flwr-clientapp` (flwr.supernode.runtime.run_clientapp) minus the bundle install and
    import. Never raises: a failing app gets a Flower `Error` reply; when no reply could be pushed
    (the message could not be pulled, the API went away), the task is left unfinished and without
    heartbeats, so the SuperNode answers with Flower's "ClientApp crashed" error once its token
    expires, as for a `flwr-clientapp` that died.
    """
    started = time.monotonic()
    channel = create_channel(server_address=address, insecure=True, interceptors=[
        RuntimeVersionClientInterceptor(component_name="flwr-clientapp"), AppIoTokenClientInterceptor(token),
        DeadlineInterceptor(APPIO_CALL_TIMEOUT_S)])
    stub = ClientAppIoStub(channel)
    heartbeat = HeartbeatSender(make_task_heartbeat_fn_grpc(stub))
    context: Context | None = None
    message_type, status, detail, pushed = "?", SubStatus.FAILED, "", False
    try:
        heartbeat.start()
        message, context, fab = pull_task_input(stub, content_wait_s)
        message_type = message.metadata.message_type
        wanted = bundle_clientapp(fab.content)
        if wanted != HACFED_CLIENTAPP:
            detail = f"the run's bundle asks for ClientApp {wanted!r}; this lab runs only {HACFED_CLIENTAPP!r}"
            reply = Message(Error(code=ErrorCode.LOAD_CLIENT_APP_EXCEPTION, reason=detail), reply_to=message)
        else:
            try:
                reply = app(message=message, context=context)
                status = SubStatus.COMPLETED
            except Exception as exc:  # noqa: BLE001 - Flower's contract: an app failure is an Error reply
                log(ERROR, "hacfed ClientApp runner: the ClientApp raised", exc_info=exc)
                detail = f"{type(exc).__name__}: {exc}"
                reply = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=detail), reply_to=message)
        push_message(stub, reply, context)
        pushed = True
    except grpc.RpcError as err:
        detail = f"ClientAppIo call failed: {err.code().name}: {err.details()}"  # type: ignore[attr-defined]
    except Exception as exc:  # noqa: BLE001 - e.g. content that never arrived, an unreadable bundle
        detail = f"{type(exc).__name__}: {exc}"
    finally:
        if heartbeat.is_running:
            heartbeat.stop()
        if pushed:
            push_task_output(stub=stub, context=context, sub_status=status, details=detail)
        channel.close()
    return TaskOutcome(task_id, message_type, status == SubStatus.COMPLETED, time.monotonic() - started, detail)


def serve_tasks(
    address: str,
    app: ClientApp,
    stop: threading.Event,
    *,
    poll_s: float = DEFAULT_POLL_S,
    on_task: Callable[[TaskOutcome], None] | None = None,
    content_wait_s: float = CONTENT_WAIT_S,
    wake: threading.Event | None = None,
) -> None:
    """Claim and run the SuperNode's ClientApp tasks one at a time until `stop` is set.

    One at a time, like the SuperNode itself (it pulls its next message only after pushing the
    reply of the last one). A task whose content has not come after `content_wait_s` is given up
    (`CONTENT_WAIT_S`). A ClientAppIo API that is not up yet or went away is retried every
    `poll_s`; the thread ends with `stop` (the SuperNode process ending ends it too: it is a daemon).
    `wake`, set by the SuperNode when it has stored a message, ends the wait before the next poll at once.
    """
    if not poll_s > 0:
        raise ValueError(f"poll_s must be > 0, got {poll_s}")
    if not content_wait_s > 0:
        raise ValueError(f"content_wait_s must be > 0, got {content_wait_s}")
    try:
        check_loopback_address(address)
    except ValueError:
        raise ValueError(f"the ClientAppIo API is plaintext and must be on loopback, got {address!r}") from None
    channel = create_channel(server_address=address, insecure=True,
                             interceptors=[RuntimeVersionClientInterceptor(component_name="SuperExec"),
                                           DeadlineInterceptor(APPIO_CALL_TIMEOUT_S)])
    stub = ClientAppIoStub(channel)
    try:
        while not stop.is_set():
            try:
                tasks = stub.PullPendingTasks(PullPendingTasksRequest()).tasks
                for task in tasks:
                    if task.type != TaskType.CLIENT_APP:
                        continue
                    token = stub.ClaimTask(ClaimTaskRequest(task_id=task.task_id)).token
                    if token:
                        outcome = run_one_task(address, token, app, task.task_id, content_wait_s)
                        log(INFO, "hacfed ClientApp runner: task %d (%s) %s in %.3fs%s", outcome.task_id,
                            outcome.message_type, "done" if outcome.ok else "FAILED", outcome.seconds,
                            f": {outcome.detail}" if outcome.detail else "")
                        if on_task is not None:
                            on_task(outcome)
                    break  # one task per poll: the SuperNode creates them one at a time anyway
            except grpc.RpcError as err:
                transient = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
                if err.code() not in transient:  # type: ignore[attr-defined]
                    log(WARNING, "hacfed ClientApp runner: ClientAppIo call failed: %s", err)
            if wake is None:
                stop.wait(poll_s)
            elif wake.wait(poll_s):
                wake.clear()
    finally:
        channel.close()


def start_runner(
    address: str, app: ClientApp, *, poll_s: float = DEFAULT_POLL_S,
    on_task: Callable[[TaskOutcome], None] | None = None, wake: threading.Event | None = None,
) -> tuple[threading.Thread, threading.Event]:
    """`serve_tasks` on a daemon thread; returns it and the event that stops it."""
    stop = threading.Event()
    thread = threading.Thread(target=serve_tasks, args=(address, app, stop),
                              kwargs={"poll_s": poll_s, "on_task": on_task, "wake": wake},
                              name="hacfed-clientapp-runner", daemon=True)
    thread.start()
    return thread, stop
