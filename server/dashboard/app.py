"""The dashboard's web app: one page, its vendored assets, and one JSON endpoint, all GET.

    app = make_app(Snapshotter(sources), public=False)

Routes: `/` (static/index.html), `/static/<file>` (only the files shipped in static/: the page's
script and stylesheet, uPlot 1.6.32 and its MIT licence, so nothing is fetched from the internet at
run time), `/api/state` (the snapshot of `reader.py`, which takes no parameters: nothing from a
request reaches SQL or the file system), `/healthz`. Any other method is 405. The page renders with
textContent only, and the headers forbid inline scripts, framing and MIME sniffing. Unless the
operator opted in to a public bind, a request whose Host header is not loopback is refused (400): a
web page that rebinds its own DNS name to 127.0.0.1 cannot read the dashboard from a browser.
"""

from __future__ import annotations

from pathlib import Path

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from hacfed.server.dashboard.reader import Snapshotter

STATIC = Path(__file__).resolve().parent / "static"
ASSETS = {
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
    "uPlot.iife.min.js": "text/javascript; charset=utf-8",
    "uPlot.min.css": "text/css; charset=utf-8",
    "LICENSE-uPlot": "text/plain; charset=utf-8",
}
SECURITY_HEADERS = {
    # uPlot sets element.style from script (allowed); no inline <script>, nothing from elsewhere
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
                               "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; "
                               "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
LOOPBACK_HOSTS = ["127.0.0.1", "localhost", "[::1]", "::1"]


def _secure(response: Response) -> Response:
    response.headers.update(SECURITY_HEADERS)
    return response


def make_app(snapshots: Snapshotter, *, public: bool = False, extra_hosts: tuple[str, ...] = ()) -> Starlette:
    async def index(request: Request) -> Response:
        return _secure(FileResponse(STATIC / "index.html", media_type="text/html; charset=utf-8"))

    async def asset(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in ASSETS:  # a fixed list: no path from the request touches the file system
            return _secure(PlainTextResponse("not found", status_code=404))
        return _secure(FileResponse(STATIC / name, media_type=ASSETS[name]))

    async def state(request: Request) -> Response:
        return _secure(JSONResponse(snapshots.get()))

    async def health(request: Request) -> Response:
        return _secure(PlainTextResponse("ok"))

    routes = [
        Route("/", index, methods=["GET"]),
        Route("/static/{name}", asset, methods=["GET"]),
        Route("/api/state", state, methods=["GET"]),
        Route("/healthz", health, methods=["GET"]),
    ]
    hosts = ["*"] if public else LOOPBACK_HOSTS + list(extra_hosts)
    return Starlette(routes=routes, middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=hosts)])
