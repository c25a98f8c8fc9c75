"""Runs the dashboard's uvicorn server in a thread of hacfed-server and stops it with the server.

    dashboard = start_dashboard(address, sources)   # returns once it listens; .url has the real port
    ...
    dashboard.stop()                                # graceful: open polls finish, then the thread ends

A thread rather than a child process: hacfed-server itself only supervises (the rounds run in the
ServerApp process the SuperLink starts), so the page's work never competes with a round for a lock
or the GIL, and the thread ends with the process even on SIGKILL; nothing is left behind to reap.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from hacfed.server.dashboard.bind import DashboardAddress
from hacfed.server.dashboard.reader import DashboardSources, Snapshotter

START_TIMEOUT_S = 30.0


@dataclass
class RunningDashboard:
    server: "object"  # uvicorn.Server
    thread: threading.Thread
    url: str
    snapshots: Snapshotter

    def stop(self, timeout_s: float = 10.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout_s)
        if self.thread.is_alive():  # a stuck client connection: close it
            self.server.force_exit = True
            self.thread.join(timeout_s)


def start_dashboard(address: DashboardAddress, sources: DashboardSources) -> RunningDashboard:
    """Bind and serve; raises ValueError naming the address when it cannot listen (port taken)."""
    import uvicorn

    from hacfed.server.dashboard.app import make_app

    snapshots = Snapshotter(sources)
    app = make_app(snapshots, public=address.public)
    config = uvicorn.Config(app, host=address.host, port=address.port, log_level="warning", access_log=False,
                            lifespan="off", server_header=False, date_header=False)
    server = uvicorn.Server(config)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            server.run()
        except BaseException as exc:  # noqa: BLE001 - reported to the starting thread
            failure.append(exc)

    thread = threading.Thread(target=run, name="hacfed-dashboard", daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or failure or time.monotonic() > deadline:
            server.should_exit = True
            thread.join(5.0)
            # uvicorn reports a failed bind by logging it and raising SystemExit(1 or 3): no reason to pass on
            known = failure and not isinstance(failure[0], SystemExit)
            reason = f": {failure[0]}" if known else " (is the port in use?)"
            raise ValueError(f"--dashboard: cannot listen on {address.url_host}:{address.port}{reason}")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    return RunningDashboard(server, thread, f"http://{address.url_host}:{port}/", snapshots)
