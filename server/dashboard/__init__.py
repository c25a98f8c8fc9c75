"""The live coordinator dashboard: `hacfed-server --dashboard 127.0.0.1:8080`.

Runs in the hacfed-server process (a thread next to its supervision loop), never in the ServerApp
that drives the rounds, and only reads: the journal through a `mode=ro` SQLite connection, the
metrics JSONL from where it last stopped, the registry's public keys. One snapshot is built at most
once per `DashboardSources.ttl_s` however many browsers poll, so the rounds never wait on it.

    bind.py     HOST:PORT checked: loopback unless the operator opts in with --dashboard-public
    reader.py   the snapshot (/api/state), pure functions over what the files hold
    app.py      the Starlette app: GET only, static files vendored under static/ (uPlot, MIT)
    serve.py    uvicorn in a thread, started and stopped by hacfed.server.runner
"""

from hacfed.server.dashboard.bind import DashboardAddress, parse_dashboard_address

__all__ = ["DashboardAddress", "parse_dashboard_address"]
