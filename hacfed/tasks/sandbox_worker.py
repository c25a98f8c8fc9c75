"""The sandboxed worker's own side: resource limits on itself, then one request at a time.

Runs only inside the worker process that `hacfed.tasks.sandbox.SandboxedWorker` starts (for the
coordinator's reward re-verification or a lab's local reward claims), never in the caller. It sets
its limits (RLIMIT_AS, FSIZE, CORE, CPU, NPROC after warm-up) before it reads any request, imports
the handler factory it was given, reports its network interfaces, then answers requests until the
parent closes the pipe or its CPU lifetime runs low. Each request is interrupted by SIGALRM at the
per-item deadline; a handler failure becomes a short reason, never a crash.

Wire format, both directions: a 4-byte big-endian length, then that many bytes of UTF-8 JSON.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import resource
import signal
import socket
import struct
import sys
from typing import Any, Callable, Mapping

FRAME_HEADER = struct.Struct(">I")
MAX_REQUEST_BYTES = 1 << 20


class _ItemTimeout(BaseException):
    """Raised by SIGALRM inside a request. A BaseException so library `except Exception` cannot swallow it."""


_armed = False


def _on_alarm(signum: int, frame: object) -> None:
    if _armed:
        raise _ItemTimeout()


def child_main(args: list[str]) -> None:
    """Entry point of the worker process (started by `hacfed.tasks.sandbox`). Not for use in the caller."""
    factory_spec, config = args[0], json.loads(args[1])
    wire_in = os.fdopen(0, "rb", buffering=0)
    wire_out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # stray prints from libraries go to stderr (discarded), never into the wire
    sys.stdout = sys.stderr
    mem = config["memory_bytes"]
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    lifetime, per_item = config["cpu_s_lifetime"], config["cpu_s_per_item"]
    resource.setrlimit(resource.RLIMIT_CPU, (lifetime, lifetime))
    try:
        module_name, func_name = factory_spec.split(":")
        factory = getattr(importlib.import_module(module_name), func_name)
        argument = config.get("factory_argument")
        handler: Callable[[dict[str, Any]], dict[str, Any]] = factory() if argument is None else factory(argument)
    except Exception as e:  # reported to the parent, which raises SandboxStartError
        _send(wire_out, {"ok": False, "error": f"{type(e).__name__}: {e}"[:300]})
        return
    if config["max_processes"] is not None:
        resource.setrlimit(resource.RLIMIT_NPROC, (config["max_processes"], config["max_processes"]))
    signal.signal(signal.SIGALRM, _on_alarm)
    _send(wire_out, {"ok": True, "interfaces": sorted(name for _, name in socket.if_nameindex())})
    while True:
        header = _read_exact_child(wire_in, FRAME_HEADER.size)
        if header is None:
            return  # parent closed the pipe: orderly shutdown
        body = _read_exact_child(wire_in, FRAME_HEADER.unpack(header)[0])
        if body is None:
            return
        used = _cpu_used()
        resource.setrlimit(resource.RLIMIT_CPU, (min(lifetime, math.ceil(used) + per_item), lifetime))
        reply = _handle_one(handler, body, config["self_timeout_s"])
        if _cpu_used() > lifetime - 2 * per_item:
            reply["retire"] = True
        _send(wire_out, reply)
        if reply.get("retire"):
            return


def _handle_one(handler: Callable[[dict[str, Any]], dict[str, Any]], body: bytes, timeout_s: float) -> dict[str, Any]:
    global _armed
    try:
        request = json.loads(body)
        _armed = True
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
        try:
            result = handler(request)
        finally:
            _armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)
        return {"ok": True, "result": result}
    except _ItemTimeout:
        return {"ok": False, "error": "timeout"}
    except (MemoryError, RecursionError) as e:
        # The interpreter may be left in a poor state: answer, then let the parent start a fresh worker.
        return {"ok": False, "error": type(e).__name__, "retire": True}
    except Exception as e:  # the sandbox boundary: any handler failure becomes a reason, never a crash
        return {"ok": False, "error": f"handler error: {type(e).__name__}"}


def _cpu_used() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _read_exact_child(stream: Any, n: int) -> bytes | None:
    if n > MAX_REQUEST_BYTES:
        raise SystemExit(f"request of {n} bytes exceeds the limit")
    data = b""
    while len(data) < n:
        chunk = stream.read(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _send(stream: Any, message: Mapping[str, Any]) -> None:
    data = json.dumps(message, ensure_ascii=True).encode("ascii")
    write_all(stream.fileno(), FRAME_HEADER.pack(len(data)) + data)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
