"""`hacfed demo --dashboard`: a real federation with the live page, loaded in headless Chromium.

While the rounds run, Chromium loads the page, lets it poll (`--virtual-time-budget`), and dumps
the DOM: a participants row per lab with its last round and idle time (its staleness cell empty: the
demo runs synchronous rounds), a round number >= 1 and four uPlot charts with points. Then a
screenshot, which must be a real picture (many colours); `HACFED_UPDATE_DOCS_IMG=1` copies it to
docs/img/dashboard.png. In a 1280 px wide window (driven over Chromium's DevTools pipe), no chart
may reach past the right edge. Ctrl-C then stops the demo and every process it started, the
dashboard's thread with hacfed-server. Skipped when Chromium is not installed (scripts/test.sh
installs Debian's `chromium` as root: scripts/install_chromium.sh).

`hacfed demo` has no max_staleness, so the staleness cells of K >= 1 are checked on a journal the
real driver wrote at K = 1 with scripted labs (tests/unit/test_dashboard_staleness.py), served by the
dashboard's own thread.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from tests.unit.test_dashboard import federation  # noqa: F401 - the fixture: a journal and its metrics

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
HACFED = str(Path(sys.executable).parent / "hacfed")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
LABS = ("lab-a-llama", "lab-b-gpt2")
_URL = re.compile(r"dashboard: (http://127\.0\.0\.1:\d+/)")


def _leftovers(state: Path) -> list[str]:
    found = []
    for proc in psutil.process_iter(["status", "cmdline"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            cmd = " ".join(proc.info["cmdline"] or [])
            if str(state) in cmd or any(str(state) in v for v in proc.environ().values()):
                found.append(cmd[:120])
        except psutil.Error:
            continue
    return found


def _chromium(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    """Headless Chromium with its profile, home and caches in the test's temp dir."""
    home = tmp / "chromium-home"
    home.mkdir(exist_ok=True)
    env = dict(os.environ, HOME=str(home), XDG_CONFIG_HOME=str(home / "config"), XDG_CACHE_HOME=str(home / "cache"))
    cmd = [CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", f"--user-data-dir={home / 'profile'}",
           "--no-first-run", "--disable-breakpad", "--disable-extensions", "--disable-sync",
           "--window-size=1400,1800", "--virtual-time-budget=8000", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, start_new_session=True)


class DevTools:
    """Headless Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe: JSON
    messages ending in NUL, commands on its fd 3, answers on its fd 4), to measure the laid-out page."""

    def __init__(self, tmp: Path, width: int, height: int) -> None:
        home = tmp / "chromium-devtools"
        home.mkdir(exist_ok=True)
        to_chromium, self._commands = os.pipe()
        self._answers, from_chromium = os.pipe()

        def pipes_as_fd_3_and_4() -> None:
            os.dup2(to_chromium, 3)
            os.dup2(from_chromium, 4)

        env = dict(os.environ, HOME=str(home), XDG_CONFIG_HOME=str(home / "config"), XDG_CACHE_HOME=str(home / "cache"))
        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", f"--user-data-dir={home / 'profile'}",
             "--no-first-run", "--disable-breakpad", "--disable-extensions", "--disable-sync",
             "--remote-debugging-pipe", f"--window-size={width},{height}", "about:blank"],
            pass_fds=(3, 4), preexec_fn=pipes_as_fd_3_and_4, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env=env, start_new_session=True)
        os.close(to_chromium)
        os.close(from_chromium)
        self._buffer, self._id, self.size = b"", 0, (width, height)

    def call(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._id += 1
        message = {"id": self._id, "method": method, "params": params or {},
                   **({"sessionId": session} if session else {})}
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self._buffer:
                chunk = os.read(self._answers, 1 << 16)
                assert chunk, "Chromium closed its DevTools pipe"
                self._buffer += chunk
            raw, self._buffer = self._buffer.split(b"\0", 1)
            answer = json.loads(raw)
            if answer.get("id") == self._id:
                assert "error" not in answer, answer
                return answer["result"]

    def open(self, url: str) -> str:
        target = self.call("Target.createTarget", {"url": url})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        width, height = self.size
        self.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1,
                                                         "mobile": False}, session)
        return session

    def evaluate(self, session: str, expression: str) -> object:
        return self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session)["result"].get(
            "value")

    def close(self) -> None:
        try:
            self.call("Browser.close")
            self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            os.close(self._commands)
            os.close(self._answers)


CHART_EDGES = """JSON.stringify({viewport: document.documentElement.clientWidth, drawn: document.querySelectorAll(
    '.uplot').length,
    right: [...document.querySelectorAll('.chart, .uplot')].map(e => e.getBoundingClientRect().right)})"""


def _chart_edges_at(tmp: Path, url: str, width: int) -> dict:
    """The right edges of the dashboard's charts once all four are drawn, in a `width` px window."""
    browser = DevTools(tmp, width, 1800)
    try:
        session = browser.open(url)
        deadline = time.monotonic() + 120
        while True:
            edges = json.loads(browser.evaluate(session, CHART_EDGES) or "{}")
            if edges.get("drawn", 0) >= 4 or time.monotonic() > deadline:
                return edges
            time.sleep(0.5)
    finally:
        browser.close()


def _get_state(url: str) -> dict:
    with urllib.request.urlopen(url + "api/state", timeout=30) as response:
        return json.loads(response.read())


NO_CHROMIUM = "Chromium is not installed (scripts/test.sh apt-installs Debian's chromium when run as root)"


@pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
def test_the_page_shows_each_labs_staleness_at_k1(tmp_path):
    """A journal the real driver wrote at max_staleness 1 (scripted labs, no models), served by the
    dashboard's thread: each lab's row shows the staleness of its latest update as the journal has it."""
    from hacfed.server.dashboard.bind import parse_dashboard_address
    from hacfed.server.dashboard.serve import start_dashboard
    from tests.unit.test_dashboard_staleness import dashboard_sources, expected, run_k1_ahead

    fed, _ = run_k1_ahead(tmp_path / "fed")
    want = expected(fed)
    assert want["lab-a"] == {"stale_step": 2, "stale_max": 1, "stale_mean": 0.5, "stale_sources": 2}
    dashboard = start_dashboard(parse_dashboard_address("127.0.0.1:0"), dashboard_sources(fed, tmp_path))
    try:
        dom = _chromium(tmp_path, "--dump-dom", dashboard.url)
    finally:
        dashboard.stop()
    assert dom.returncode == 0, dom.stderr[-2000:]
    rows = dict(re.findall(r'<tr data-participant="([^"]+)">.*?<td class="num pace-stale">(.*?)</td>', dom.stdout))
    assert rows == {pid: f"max {w['stale_max']}, mean {w['stale_mean']:.2f} (step {w['stale_step']})"
                    for pid, w in want.items()}, dom.stdout[-3000:]
    assert rows["lab-a"] == "max 1, mean 0.50 (step 2)"


def _page_after_a_report(tmp_path, sources, metrics: dict):
    """The page (Chromium's dumped DOM) after lab-a's round-2 step report carried `metrics`."""
    from hacfed.server.dashboard.bind import parse_dashboard_address
    from hacfed.server.dashboard.serve import start_dashboard
    from hacfed.server.reporting import append_rows

    append_rows(sources.metrics, [{"round": 2, "agent": "lab-a", "mode": "xhacpo", "seed": 0, "reward_mean": 0.5,
                                   **metrics}])
    dashboard = start_dashboard(parse_dashboard_address("127.0.0.1:0"), sources)
    try:
        dom = _chromium(tmp_path, "--dump-dom", dashboard.url)
    finally:
        dashboard.stop()
    assert dom.returncode == 0, dom.stderr[-2000:]
    return dom


@pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
def test_the_page_warns_of_a_lab_whose_responses_are_mostly_cut_at_the_budget(tmp_path, federation):  # noqa: F811
    """The journal and metrics of tests/unit/test_dashboard.py's federation, lab-a's last row with 62 %
    of its responses cut at the budget: the page says so above the table, in the words hacfed-client
    prints, and its cut cell is marked; lab-b (no fraction reported) gets no warning (issue 43)."""
    dom = _page_after_a_report(tmp_path, federation["sources"], {"train/rollout_truncated_frac": 0.62})
    warnings = re.findall(r'<li data-participant="([^"]+)">(.*?)</li>', dom.stdout)
    assert warnings == [("lab-a", "warning: lab-a: 62% of its responses were cut at the response budget (finish "
                                  "reason 'length'); their rewards score unfinished answers: raise [sampling] "
                                  "max_new_tokens")], dom.stdout[-3000:]
    rows = dict(re.findall(r'<tr data-participant="([^"]+)">(.*?)</tr>', dom.stdout))
    cells = re.findall(r'<td(?: class="([^"]*)")?>(.*?)</td>', rows["lab-a"])
    assert cells[-6] == ("num bad", "0.62"), cells  # the "cut" column, before P̂ and the four learner columns


@pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
def test_the_page_shows_how_the_partners_samples_act_on_each_lab(tmp_path, federation):  # noqa: F811
    """lab-a's last step report carries its KL to the start model, the share of its answers still in
    its first form, the share of partners' samples it used and its trust in each partner (one named
    with markup, as a hostile peer could be): the page shows them as text; lab-b, which reported none,
    shows dashes and empty cells (issue 39, "What a lab sees every update")."""
    dom = _page_after_a_report(tmp_path, federation["sources"], {
        "train/kl": 0.3141, "train/answer_form_start_share": 0.38, "train/partner/grad_frac": 0.22,
        "train/partner/in_context_frac": 0.5, "train/trust/lab-b": 0.08, "train/trust/<b>x</b>": 1.0})
    rows = dict(re.findall(r'<tr data-participant="([^"]+)">(.*?)</tr>', dom.stdout))
    learner = {pid: re.findall(r'<td class="([^"]*learner[^"]*)">(.*?)</td>', row) for pid, row in rows.items()}
    assert learner["lab-a"] == [("num learner-kl", "0.314"), ("num bad learner-form", "0.38"),
                                ("learner-partners", "22 % with gradient, 50 % as hints"),
                                ("learner-trust", "&lt;b&gt;x&lt;/b&gt; 1.00, lab-b 0.08")], dom.stdout[-3000:]
    assert learner["lab-b"] == [("num learner-kl", "-"), ("num learner-form", "-"), ("learner-partners", ""),
                                ("learner-trust", "")]


@pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
def test_the_dashboard_shows_the_live_rounds_in_a_browser(tmp_path):
    state = tmp_path / "state"
    demo = subprocess.Popen(
        [HACFED, "demo", "--agents", "tiny-llama,tiny-gpt2", "--prompts-per-round", "2", "--group-size", "4",
         "--eval-every", "2", "--rounds", "200", "--state-dir", str(state), "--metrics-out", str(tmp_path / "m.jsonl"),
         "--plot", str(tmp_path / "p.png"), "--dashboard", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(demo.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        url, deadline = None, time.monotonic() + 900
        while url is None and demo.poll() is None and time.monotonic() < deadline:
            found = _URL.search("".join(lines))
            url = found.group(1) if found else None
            time.sleep(0.2)
        assert url, "".join(lines)[-3000:]
        live = {}
        while time.monotonic() < deadline and demo.poll() is None:  # at least rounds 0 and 1 closed
            live = _get_state(url)
            if live["round"]["closed"] >= 2 and set(live["curves"]["labs"]) == set(LABS):
                break
            time.sleep(1)
        assert live.get("round", {}).get("closed", 0) >= 2, "".join(lines)[-3000:]
        assert {p["id"] for p in live["participants"] if p["connected"]} == set(LABS)
        # each lab answered rounds 0 and 1, and one of them waited for the other between a reply and its next plan
        assert all(p["last_round"] >= 1 and p["idle_share"] is not None for p in live["participants"]), live
        assert sum(p["idle_s"] for p in live["participants"]) > 0, live

        dom = _chromium(tmp_path, "--dump-dom", url)
        assert dom.returncode == 0, dom.stderr[-2000:]
        html = dom.stdout
        for lab in LABS:
            assert f'data-participant="{lab}"' in html, html[-3000:]
        shown = re.search(r'<body[^>]*data-round="(\d+)"', html)
        assert shown and int(shown.group(1)) >= 1, html[:2000]
        assert html.count('class="uplot') >= 4  # the four charts were drawn
        found = re.finditer(r'id="(chart-[a-z]+)"[^>]*data-points="(\d+)"', html)
        points = {m.group(1): int(m.group(2)) for m in found}
        assert set(points) == {"chart-reward", "chart-capability", "chart-eval", "chart-times"}, points
        assert all(n >= 2 for n in points.values()), points
        assert "poll failed" not in html
        shown_rounds = re.findall(r'<td class="num pace-round">(\d+)</td>', html)
        assert len(shown_rounds) == len(LABS) and all(int(n) >= 1 for n in shown_rounds), html[-3000:]
        idle_totals = re.findall(r'<td class="num pace-idle-total">\d+\.\d s \(\d+ %\)</td>', html)
        assert len(idle_totals) == len(LABS), html[-3000:]
        assert re.findall(r'<td class="num pace-stale">(.*?)</td>', html) == [""] * len(LABS)  # K = 0: empty

        shot = tmp_path / "dashboard.png"
        result = _chromium(tmp_path, f"--screenshot={shot}", url)
        assert result.returncode == 0 and shot.exists(), result.stderr[-2000:]
        data = shot.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 30_000
        from PIL import Image

        with Image.open(shot) as image:
            assert image.size == (1400, 1800)
            colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
        assert colours is not None and len(colours) > 200  # text, tables and coloured curves, not a blank page
        if os.environ.get("HACFED_UPDATE_DOCS_IMG") == "1":
            shutil.copyfile(shot, ROOT / "docs" / "img" / "dashboard.png")

        # A 1280 px wide window: no chart is cut off at the right (they go to one column)
        edges = _chart_edges_at(tmp_path, url, 1280)
        assert edges.get("drawn", 0) >= 4 and edges["viewport"] <= 1280, edges
        assert max(edges["right"]) <= edges["viewport"], edges

        demo.send_signal(signal.SIGINT)
        demo.wait(timeout=300)
        assert demo.returncode == 130
        time.sleep(1)
        assert _leftovers(state) == []
        with pytest.raises(OSError):
            _get_state(url)  # the dashboard stopped with hacfed-server
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
