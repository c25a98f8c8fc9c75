"""hacfed-server --dashboard: the refusal of a public bind, the read-only snapshot of a real journal
made by the coordinator, and every endpoint of the Starlette app (TestClient) and of the real
uvicorn thread."""

from __future__ import annotations

import json
import sqlite3
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from hacfed.envelope import generate_key
from hacfed.keys import fingerprint
from hacfed.server.config import ServerSettings
from hacfed.server.dashboard.app import STATIC, make_app
from hacfed.server.dashboard.bind import parse_dashboard_address
from hacfed.server.dashboard.reader import BUDGET_SETTING, DashboardSources, MetricsTail, Snapshotter, open_read_only
from hacfed.server.dashboard.serve import start_dashboard
from hacfed.server.registry import register_signing_key
from hacfed.server.reporting import StepTimes, append_rows, round_rows, split_round
from hacfed.truncation_warnings import truncation_warning
from tests.unit.test_coordinator_fakes import FakeClock, make_coordinator, scripted_submission

# -- the bind address -------------------------------------------------------------------------------


@pytest.mark.parametrize("address", ["127.0.0.1:8080", "localhost:0", "[::1]:8080", "127.0.0.2:9000"])
def test_loopback_addresses_are_accepted(address):
    parsed = parse_dashboard_address(address)
    assert not parsed.public and parsed.port == int(address.rsplit(":", 1)[1])


@pytest.mark.parametrize("address", ["0.0.0.0:8080", "192.168.1.5:8080", "[::]:8080", "coordinator.example:80"])
def test_a_public_bind_is_refused_without_the_opt_in(address):
    with pytest.raises(ValueError) as info:
        parse_dashboard_address(address)
    message = str(info.value)
    assert address in message and "--dashboard-public" in message and "ssh -L 8080:127.0.0.1:8080" in message
    assert parse_dashboard_address(address, public=True).public  # the explicit opt-in


@pytest.mark.parametrize("address", ["8080", "127.0.0.1:", "127.0.0.1:70000", ""])
def test_a_malformed_address_names_the_value(address):
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_dashboard_address(address)


def test_server_settings_refuse_a_public_dashboard(tmp_path):
    with pytest.raises(ValueError, match="server.dashboard.*not a loopback"):
        ServerSettings(insecure=True, dashboard="0.0.0.0:8080")
    assert ServerSettings(insecure=True, dashboard="0.0.0.0:8080", dashboard_public=True).dashboard_public
    with pytest.raises(ValueError, match="dashboard_public must be true or false"):
        ServerSettings(insecure=True, dashboard_public="yes")


def test_hacfed_server_refuses_a_public_dashboard_in_one_line_before_any_file(tmp_path, capsys):
    from hacfed.server.main import main

    config = tmp_path / "coordinator.toml"
    state = tmp_path / "state"
    config.write_text(f'run_id = "d"\nrounds = 1\nprompts_per_round = 1\ngroup_size = 2\nexpected_participants = 1\n'
                      f'min_participants = 1\nround_deadline_s = 10.0\nstate_dir = "{state}"\n'
                      f'[task]\nkind = "arithmetic"\ndigits = 2\n')
    code = main(["--config", str(config), "--insecure", "--dashboard", "0.0.0.0:8080"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--dashboard-public" in err[0] and "Traceback" not in err[0]
    assert not state.exists()


def test_hacfed_demo_refuses_a_public_dashboard_before_starting_anything(tmp_path, capsys):
    from hacfed.tools.cli import main

    state = tmp_path / "demo"
    code = main(["demo", "--dashboard", "0.0.0.0:8080", "--state-dir", str(state)])
    err = capsys.readouterr().err
    assert code == 2 and "hacfed demo: error: --dashboard" in err and "not a loopback" in err
    assert not state.exists()


# -- a real journal -------------------------------------------------------------------------------


@pytest.fixture
def federation(tmp_path):
    """Two closed rounds (lab-b falsifies one reward per round: strikes and a rejection code), an
    open third round lab-a already answered; metrics rows written the way the driver writes them."""
    clock = FakeClock(start=1_000_000.0)
    state = tmp_path / "state"
    coord = make_coordinator(state, clock, rounds=5, expected_participants=2, round_deadline_s=100.0)
    keys = state / "keys"
    keys.mkdir(parents=True)
    prints = {}
    for pid in ("lab-a", "lab-b"):
        key = generate_key().public_key()
        register_signing_key(keys, pid, key)
        prints[pid] = fingerprint(key)
        coord.register(pid)
    metrics = state / "metrics.jsonl"
    for r in range(2):
        plan = coord.open_round(r)
        clock.t += 3.0
        coord.submit(scripted_submission(plan, "lab-a", eval_accuracy=0.5 if plan.evaluate else None))
        coord.submit(scripted_submission(plan, "lab-b", falsify=1))
        clock.t += 1.0
        coord.close_round("quorum")
        steps = {"lab-a": StepTimes(0.5, 1.0, 0.2, 0.1, 3.0), "lab-b": StepTimes(0.4, 0.8, 0.1, 0.1, 2.0)}
        times = split_round(4.0, 0.3, steps)
        append_rows(metrics, round_rows(coord.round_summary(r), "xhacpo", 0, times, steps))
    plan = coord.open_round(2)
    clock.t += 10.0
    coord.submit(scripted_submission(plan, "lab-a"))
    sources = DashboardSources(journal=coord.cfg.journal_path, metrics=metrics, keys_dir=keys,
                               status=state / "driver-status.json", run_id="test-run", rounds=5,
                               round_deadline_s=100.0, expected_participants=2, ttl_s=1.0)
    return {"coord": coord, "clock": clock, "sources": sources, "prints": prints}


def test_the_snapshot_shows_participants_round_curves_counts_and_times(federation):
    coord, clock = federation["coord"], federation["clock"]
    state = Snapshotter(federation["sources"], clock=clock).get()
    assert state["error"] is None and state["run_id"] == "test-run"
    parts = {p["id"]: p for p in state["participants"]}
    assert set(parts) == {"lab-a", "lab-b"}
    for pid in parts:
        assert parts[pid]["fingerprint"] == federation["prints"][pid] and parts[pid]["connected"]
    assert parts["lab-b"]["strikes"] == 2 and parts["lab-a"]["strikes"] == 0
    assert parts["lab-a"]["submitted_this_round"] and not parts["lab-b"]["submitted_this_round"]
    cur = state["round"]["current"]
    assert (cur["id"], cur["state"], state["round"]["closed"], state["round"]["total"]) == (2, "OPEN", 2, 5)
    assert cur["elapsed_s"] == pytest.approx(10.0) and cur["remaining_s"] == pytest.approx(90.0)
    assert cur["submitted"] == ["lab-a"] and cur["expected"] == 2
    curves = state["curves"]
    assert curves["rounds"] == [0, 1] and curves["labs"] == ["lab-a", "lab-b"]
    summary = coord.round_summary(1)
    by_id = {m.participant_id: m for m in summary.participants}
    assert curves["reward"]["lab-a"][1] == pytest.approx(by_id["lab-a"].reward_mean)
    assert curves["capability"]["lab-b"][1] == pytest.approx(by_id["lab-b"].capability)
    assert curves["eval_accuracy"]["lab-a"] == [0.5, None]  # eval_every=2: only round 0 evaluated
    counts = state["counts"]
    journal_accepted = coord.journal._db.execute("SELECT COUNT(*) FROM trajectories").fetchone()[0]
    assert counts["accepted"] == journal_accepted and counts["rejected"] > 0
    assert counts["codes"]["HACFED-E-REWARD-MISMATCH"] == 2  # one falsified reward per round
    journal_codes = dict(coord.journal._db.execute("SELECT code, COUNT(*) FROM rejections GROUP BY code").fetchall())
    assert counts["codes"] == journal_codes and counts["rejected"] == sum(journal_codes.values())
    assert {r["id"] for r in counts["by_lab"]} == {"lab-b"}
    times = state["times"]
    assert times["rounds"] == [0, 1] and times["slowest"] == ["lab-a", "lab-a"]
    split = split_round(4.0, 0.3, {"lab-a": StepTimes(0.5, 1.0, 0.2, 0.1, 3.0)})
    assert times["training"][0] == pytest.approx(split.training_s)
    assert times["exchange"][0] == pytest.approx(split.exchange_s)
    total = sum(times[p][0] for p in ("rollout", "training", "eval", "exchange", "coordinator"))
    assert total == pytest.approx(times["wall"][0])


def test_a_lab_silent_for_long_is_not_connected_and_a_quarantine_shows(federation):
    clock = federation["clock"]
    clock.t += 3600
    state = Snapshotter(federation["sources"], clock=clock).get()
    assert not any(p["connected"] for p in state["participants"])
    assert state["round"]["current"]["remaining_s"] == 0.0


def test_the_snapshot_is_cached_and_never_writes_the_journal(federation):
    sources, clock = federation["sources"], federation["clock"]
    journal = Path(sources.journal)
    before = journal.read_bytes()
    snaps = Snapshotter(sources, clock=clock)
    first = snaps.get()
    assert snaps.get() is first and snaps.builds == 1  # within ttl_s: every poller shares it
    clock.t += 1.5
    assert snaps.get() is not first and snaps.builds == 2
    assert journal.read_bytes() == before
    db = open_read_only(journal)
    with pytest.raises(sqlite3.OperationalError):
        db.execute("DELETE FROM participants")
    db.close()


def test_the_coordinator_keeps_writing_while_the_dashboard_reads(federation):
    coord, clock = federation["coord"], federation["clock"]
    snaps = Snapshotter(federation["sources"], clock=clock)
    snaps.get()
    plan = coord.plan_for(2)
    assert coord.submit(scripted_submission(plan, "lab-b")).receipt is not None
    coord.close_round("quorum")
    clock.t += 2
    assert snaps.get()["round"]["closed"] == 3


def test_a_missing_journal_and_metrics_read_as_empty(tmp_path):
    sources = DashboardSources(journal=tmp_path / "j.sqlite", metrics=tmp_path / "m.jsonl", keys_dir=tmp_path / "k",
                               status=tmp_path / "s.json", run_id="r", rounds=3, round_deadline_s=10.0)
    state = Snapshotter(sources).get()
    assert state["error"] is None and state["participants"] == [] and state["round"]["current"] is None
    assert not (tmp_path / "j.sqlite").exists()  # mode=ro never creates it


def test_metrics_tail_reads_only_complete_new_lines(tmp_path):
    path = tmp_path / "m.jsonl"
    tail = MetricsTail(path)
    assert tail.read() == []
    path.write_text('{"round": 0, "agent": "a"}\n{"round": 1, "ag')
    assert [r["round"] for r in tail.read()] == [0]
    with path.open("a") as fh:
        fh.write('ent": "a"}\nnot json\n')
    assert [r["round"] for r in tail.read()] == [0, 1]
    path.write_text('{"round": 5, "agent": "b"}\n')  # rewritten shorter: start over
    assert [r["round"] for r in tail.read()] == [5]


# -- the app ------------------------------------------------------------------------------------------


@pytest.fixture
def client(federation):
    return TestClient(make_app(Snapshotter(federation["sources"], clock=federation["clock"])),
                      base_url="http://127.0.0.1:8080")


def test_the_page_and_its_vendored_assets(client):
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["x-frame-options"] == "DENY" and page.headers["x-content-type-options"] == "nosniff"
    assert '<script src="/static/uPlot.iife.min.js">' in page.text and "<script>" not in page.text
    assert "http://" not in page.text and "https://" not in page.text  # nothing fetched from elsewhere
    js = client.get("/static/uPlot.iife.min.js")
    assert js.status_code == 200 and "uPlot" in js.text and len(js.text) > 20_000
    assert "MIT" in client.get("/static/LICENSE-uPlot").text
    assert client.get("/static/dashboard.js").status_code == 200
    for bad in ("/static/index.html", "/static/..%2Fapp.py", "/static/%2e%2e/app.py", "/static/nope.js"):
        assert client.get(bad).status_code == 404, bad


def test_the_page_never_renders_with_inner_html():
    script = (STATIC / "dashboard.js").read_text()
    assert "innerHTML" not in script and "outerHTML" not in script and "insertAdjacentHTML" not in script
    assert "document.write" not in script and "eval(" not in script
    assert script.count("textContent") >= 5


def test_api_state_is_the_snapshot_as_json(client, federation):
    response = client.get("/api/state")
    assert response.status_code == 200 and response.headers["cache-control"] == "no-store"
    data = response.json()
    assert {p["id"] for p in data["participants"]} == {"lab-a", "lab-b"}
    assert data["round"]["current"]["id"] == 2 and data["curves"]["rounds"] == [0, 1]
    assert json.loads(json.dumps(data)) == data


def test_only_get_and_a_loopback_host_are_served(client, federation):
    for method in ("post", "put", "delete", "patch"):
        assert getattr(client, method)("/api/state").status_code == 405
    assert client.get("/api/state?round=1;DROP TABLE rounds").status_code == 200  # parameters are ignored
    assert client.get("/api/state", headers={"host": "attacker.example"}).status_code == 400  # DNS rebinding
    public = TestClient(make_app(Snapshotter(federation["sources"]), public=True), base_url="http://dash.example")
    assert public.get("/healthz").text == "ok"


def test_the_uvicorn_thread_serves_and_stops(federation):
    address = parse_dashboard_address("127.0.0.1:0")
    dashboard = start_dashboard(address, federation["sources"])
    try:
        assert dashboard.url.startswith("http://127.0.0.1:") and not dashboard.url.endswith(":0/")
        with urllib.request.urlopen(dashboard.url + "api/state", timeout=30) as response:
            data = json.loads(response.read())
        assert {p["id"] for p in data["participants"]} == {"lab-a", "lab-b"}
        port = int(dashboard.url.rsplit(":", 1)[1].rstrip("/"))
        with pytest.raises(ValueError, match="cannot listen"):
            start_dashboard(parse_dashboard_address(f"127.0.0.1:{port}"), federation["sources"])
    finally:
        dashboard.stop()
    assert not dashboard.thread.is_alive()
    assert "hacfed-dashboard" not in {t.name for t in threading.enumerate()}
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(dashboard.url + "healthz", timeout=5)


def test_hacfed_server_starts_the_dashboard_of_its_config_and_stops_it(tmp_path, federation):
    from hacfed.server.config import load_server_config
    from hacfed.server.runner import start_dashboard_of

    state = Path(federation["sources"].journal).parent
    config = tmp_path / "coordinator.toml"
    config.write_text(f'run_id = "test-run"\nrounds = 5\nprompts_per_round = 2\ngroup_size = 3\n'
                      f'expected_participants = 2\nmin_participants = 1\nround_deadline_s = 100.0\n'
                      f'state_dir = "{state}"\n[task]\nkind = "arithmetic"\ndigits = 2\n'
                      f'[server]\ninsecure = true\ndashboard = "127.0.0.1:0"\n')
    cfg = load_server_config(config)
    dashboard = start_dashboard_of(cfg)
    try:
        with urllib.request.urlopen(dashboard.url + "api/state", timeout=30) as response:
            data = json.loads(response.read())
        assert data["run_id"] == "test-run" and data["round"]["total"] == 5 and data["round"]["closed"] == 2
        assert {p["id"] for p in data["participants"]} == {"lab-a", "lab-b"}
    finally:
        dashboard.stop()
    assert not dashboard.thread.is_alive()
    with pytest.raises(ValueError, match="server.dashboard must be HOST:PORT"):
        load_server_config(config, sets=['server.dashboard=""'])
    config.write_text(config.read_text().replace('dashboard = "127.0.0.1:0"\n', ""))
    assert start_dashboard_of(load_server_config(config)) is None  # off unless asked for


def test_the_participants_table_shows_the_fraction_of_responses_cut_at_the_budget(federation):
    sources = federation["sources"]
    append_rows(sources.metrics, [{"round": 1, "agent": "lab-a", "mode": "xhacpo", "seed": 0, "reward_mean": 0.5,
                                   "train/rollout_truncated_frac": 0.25}])
    parts = {p["id"]: p for p in Snapshotter(sources, clock=federation["clock"]).get()["participants"]}
    assert parts["lab-a"]["truncated"] == 0.25 and parts["lab-b"]["truncated"] is None
    assert parts["lab-a"]["truncation_warning"] == truncation_warning("lab-a", 0.25, BUDGET_SETTING)
    assert "25% of its responses were cut at the response budget" in parts["lab-a"]["truncation_warning"]
    assert parts["lab-b"]["truncation_warning"] is None
    append_rows(sources.metrics, [{"round": 2, "agent": "lab-a", "mode": "xhacpo", "seed": 0, "reward_mean": 0.5,
                                   "train/rollout_truncated_frac": 0.1}])  # at the threshold: no warning
    parts = {p["id"]: p for p in Snapshotter(sources, clock=federation["clock"]).get()["participants"]}
    assert parts["lab-a"]["truncated"] == 0.1 and parts["lab-a"]["truncation_warning"] is None


def test_each_labs_last_round_how_far_behind_and_its_idle_time(federation):
    """Rounds 0 and 1 opened at +0 and +4 s, both labs answered 3 s after the opening and the next
    round opened 1 s later; round 2 opened at +8, lab-a answered it at +18 and now waits."""
    clock = federation["clock"]
    clock.t += 2.5
    parts = {p["id"]: p for p in Snapshotter(federation["sources"], clock=clock).get()["participants"]}
    a, b = parts["lab-a"], parts["lab-b"]
    assert (a["last_round"], a["behind"], b["last_round"], b["behind"]) == (2, 0, 1, 1)
    assert a["waiting_s"] == pytest.approx(2.5) and b["waiting_s"] is None  # lab-b works on round 2
    for p in (a, b):
        assert p["idle_last_s"] == pytest.approx(1.0) and p["idle_s"] == pytest.approx(2.0)
        assert p["idle_share"] == pytest.approx(2.0 / 8.0)


def test_pace_of_the_last_round_ends_at_its_close_and_absurd_times_are_left_out():
    from hacfed.server.dashboard.pace import lab_paces

    rounds = [{"round_id": 0, "state": "PUBLISHED", "opened_at": 0.0, "closed_at": 5.0},
              {"round_id": 1, "state": "CLOSED", "opened_at": 5.0, "closed_at": 12.0}]
    subs = [{"participant_id": "fast", "round_id": 0, "received_at": 1.0},
            {"participant_id": "fast", "round_id": 1, "received_at": 6.0},
            {"participant_id": "slow", "round_id": 0, "received_at": 5.0},
            {"participant_id": "slow", "round_id": 1, "received_at": 12.0},
            {"participant_id": "late", "round_id": 0, "received_at": 9.0},  # after round 1 opened: no idle
            {"participant_id": "odd", "round_id": 0, "received_at": float("nan")}]
    paces = lab_paces(subs, rounds, total_rounds=2, now=100.0)
    fast = paces["fast"]  # round 1 is the last: its final update is sent when it closes
    assert (fast["idle_s"], fast["idle_last_s"], fast["waiting_s"]) == (4.0 + 6.0, 6.0, None)
    assert fast["idle_share"] == pytest.approx(10.0 / 12.0) and fast["behind"] == 0
    assert (paces["slow"]["idle_s"], paces["slow"]["idle_share"]) == (0.0, 0.0)
    assert (paces["late"]["idle_s"], paces["late"]["idle_share"], paces["late"]["behind"]) == (0.0, None, 1)
    assert paces["odd"]["idle_last_s"] is None and paces["odd"]["idle_share"] is None
    assert json.loads(json.dumps(paces, allow_nan=False)) == paces
    rounds[1] = {**rounds[1], "state": "OPEN", "closed_at": None}
    assert lab_paces(subs, rounds, 2, now=100.0)["fast"]["waiting_s"] == 94.0  # replied, round 1 still open


def test_the_learner_columns_take_only_numbers_in_range_and_a_bounded_list_of_partners():
    """A lab's step report is its own claim: a value out of range or not a number is shown as missing,
    and a report naming many partners (or long names) cannot grow the table without bound."""
    from hacfed.server.dashboard.learner import MAX_NAME, MAX_TRUST, learner_view

    assert learner_view({}) == {"kl_start": None, "form_share": None, "partner_grad": None,
                                "partner_context": None, "trust": {}, "trust_more": 0}
    good = learner_view({"train/kl": 0.25, "train/answer_form_start_share": 0.9, "train/cross_grad_frac": 0.2,
                         "train/trust/lab-b": 0.5})
    assert (good["kl_start"], good["form_share"], good["partner_grad"], good["trust"]) == (0.25, 0.9, 0.2,
                                                                                          {"lab-b": 0.5})
    ruled = learner_view({"train/partner/grad_frac": 0.0, "train/cross_grad_frac": 0.7})
    assert ruled["partner_grad"] == 0.0  # with a learner-side rule, its own share wins
    bad = learner_view({"train/kl": float("inf"), "train/answer_form_start_share": 1.5, "train/cross_grad_frac": True,
                        "train/partner/in_context_frac": "0.5", "train/trust/lab-b": -1, "train/trust/": 0.5,
                        "train/trust/lab-c": float("nan")})
    assert bad == {"kl_start": None, "form_share": None, "partner_grad": None, "partner_context": None,
                   "trust": {}, "trust_more": 0}
    assert learner_view({"train/kl": -0.5})["kl_start"] is None
    many = learner_view({f"train/trust/{i:02d}{'p' * 100}": 0.5 for i in range(MAX_TRUST + 5)})
    assert len(many["trust"]) == MAX_TRUST and many["trust_more"] == 5
    assert all(len(name) == MAX_NAME for name in many["trust"])
    cut_alike = learner_view({f"train/trust/{'p' * 100}{i}": 0.5 for i in range(3)})
    assert len(cut_alike["trust"]) == 1 and cut_alike["trust_more"] == 2  # none lost without a count


def test_the_participants_table_carries_the_learner_columns(federation):
    sources = federation["sources"]
    append_rows(sources.metrics, [{"round": 1, "agent": "lab-a", "mode": "xhacpo", "seed": 0, "reward_mean": 0.5,
                                   "train/kl": 0.31, "train/trust/lab-b": 0.08}])
    parts = {p["id"]: p for p in Snapshotter(sources, clock=federation["clock"]).get()["participants"]}
    assert parts["lab-a"]["kl_start"] == 0.31 and parts["lab-a"]["trust"] == {"lab-b": 0.08}
    assert parts["lab-b"]["kl_start"] is None and parts["lab-b"]["trust"] == {}
