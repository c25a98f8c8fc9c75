"""R7: no RPC of hacfed's own code goes out without a deadline, and the participant's handlers honour theirs.

- `call_participant` refuses a call without a positive timeout before anything is sent;
- every gRPC channel hacfed's code opens either is the relay's, whose one call passes its timeout,
  or carries `DeadlineInterceptor`, which gives Flower's helpers' calls (they set none) a deadline;
- the participant service honours its callers' deadlines: a caller whose deadline passes gets
  DEADLINE_EXCEEDED (`HACFED-E-PARTICIPANT-TIMEOUT`); a request whose deadline passed while it waited
  for the busy worker never reaches the handler; and calls that time out leave no thread behind: the
  server's threads stay within its worker pool, and once the slow handler returns and the server
  stops, the process has the threads it had before.
"""

from __future__ import annotations

import ast
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from flwr.supercore.grpc import create_channel

from hacfed.clients.relay import RelayError, call_participant, serve_participant
from hacfed.clients.rpc_deadline import DeadlineInterceptor, MissingDeadlineError

ROOT = Path(__file__).resolve().parents[2]
CHANNEL_MAKERS = {"create_channel", "insecure_channel", "secure_channel", "intercept_channel"}
# Not channels of hacfed's code: hacfed.flower_keepalive wraps the factories Flower's own code calls
# (its channels and their calls are Flower's: R6 bounds those by keepalive).
FLOWERS_FACTORIES = {("hacfed/flower_keepalive.py", name) for name in ("insecure_channel", "secure_channel")}


class SlowHandler:
    """Counts its calls; the first `hold` calls wait until `release` is set."""

    def __init__(self, hold: int = 1) -> None:
        self.calls: list[bytes] = []
        self.hold = hold
        self.release = threading.Event()
        self.done = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, request: bytes) -> bytes:
        with self._lock:
            self.calls.append(request)
            held = len(self.calls) <= self.hold
        if held:
            self.release.wait(30)
            self.done.set()
        return b"ok:" + request


@pytest.mark.parametrize("timeout", [None, 0, -1.0, True])
def test_a_call_to_the_participant_without_a_timeout_is_refused_before_anything_is_sent(timeout):
    handler = SlowHandler(hold=0)
    server, port = serve_participant(handler)
    try:
        with pytest.raises(ValueError, match=r"needs a timeout_s > 0, got"):
            call_participant(f"127.0.0.1:{port}", b"x", timeout_s=timeout)
        assert call_participant(f"127.0.0.1:{port}", b"y", timeout_s=5.0) == b"ok:y"
        assert handler.calls == [b"y"]
    finally:
        server.stop(0).wait()


def _channel_calls(path: Path) -> list[tuple[str, str, int]]:
    """(function the call is in, its source, line) for each channel opened in `path`."""
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text)
    found = []
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(func):
            if isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if name in CHANNEL_MAKERS:
                    found.append((func.name, ast.get_source_segment(text, node) or "", node.lineno))
    return found


def test_every_channel_of_hacfeds_code_gives_each_call_a_deadline():
    sources = [p for d in ("hacfed", "server", "clients") for p in sorted((ROOT / d).rglob("*.py"))]
    channels = {(p.relative_to(ROOT).as_posix(), *c) for p in sources for c in _channel_calls(p)}
    assert channels, "no channel found: the scan is broken"
    unbounded = []
    assert {(path, func) for path, func, _, _ in channels} >= FLOWERS_FACTORIES  # else drop the exemption
    for path, func, source, line in sorted(channels):
        if (path, func) in FLOWERS_FACTORIES:
            continue
        if path == "clients/relay.py" and func == "call_participant":
            relay = (ROOT / path).read_text(encoding="utf-8")
            body = relay[relay.index("def call_participant"):relay.index("def check_participant_address")]
            assert "exchange(payload, timeout=timeout_s)" in body  # its one call passes the checked timeout
            continue
        if "DeadlineInterceptor(" not in source:
            unbounded.append(f"{path}:{line} ({func}): {source}")
    assert not unbounded, "channels whose calls may go out without a deadline:\n" + "\n".join(unbounded)


def _generic_server(handler: SlowHandler) -> tuple[grpc.Server, int]:
    method = grpc.unary_unary_rpc_method_handler(lambda request, context: handler(request))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2),
                         handlers=[grpc.method_handlers_generic_handler("t.S", {"M": method})])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


def test_the_deadline_interceptor_bounds_a_call_made_without_a_timeout():
    handler = SlowHandler(hold=1)
    server, port = _generic_server(handler)
    try:
        channel = create_channel(f"127.0.0.1:{port}", insecure=True, interceptors=[DeadlineInterceptor(0.5)])
        call = channel.unary_unary("/t.S/M")
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as err:
            call(b"a")  # as Flower's helpers call: no timeout
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert time.monotonic() - started < 5.0
        assert call(b"b", timeout=5.0) == b"ok:b"  # an explicit timeout is kept
        channel.close()
        strict = create_channel(f"127.0.0.1:{port}", insecure=True, interceptors=[DeadlineInterceptor(None)])
        with pytest.raises(MissingDeadlineError, match=r"/t.S/M has no timeout"):
            strict.unary_unary("/t.S/M")(b"c")
        strict.close()
        assert handler.calls == [b"a", b"b"]
    finally:
        handler.release.set()
        server.stop(0).wait()


def _timed_out(address: str, payload: bytes, timeout_s: float) -> str:
    with pytest.raises(RelayError) as err:
        call_participant(address, payload, timeout_s=timeout_s)
    return err.value.code


def test_a_request_whose_deadline_passed_in_the_queue_never_runs_and_no_thread_leaks():
    baseline = threading.active_count()
    handler = SlowHandler(hold=1)
    server, port = serve_participant(handler, max_workers=1)
    address = f"127.0.0.1:{port}"
    try:
        assert _timed_out(address, b"first", 0.5) == "HACFED-E-PARTICIPANT-TIMEOUT"  # its handler still runs
        with futures.ThreadPoolExecutor(max_workers=8) as pool:  # these wait for the one busy worker
            codes = list(pool.map(lambda i: _timed_out(address, b"queued-%d" % i, 0.5), range(8)))
        assert codes == ["HACFED-E-PARTICIPANT-TIMEOUT"] * 8
        busy = threading.active_count()
        handler.release.set()
        assert handler.done.wait(10)
        assert call_participant(address, b"after", timeout_s=5.0) == b"ok:after"
        assert handler.calls == [b"first", b"after"], "a request whose caller had given up was run"
        assert busy - baseline <= 8, f"{busy - baseline} threads for a 1-worker server"
    finally:
        handler.release.set()
        server.stop(0).wait()
    deadline = time.monotonic() + 10
    while threading.active_count() > baseline and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= baseline, [t.name for t in threading.enumerate()]
