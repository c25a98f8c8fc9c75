"""The hostile corpus against a running hacfed-server (security.md S4; issue 9, "Fault and fuzz suite").

A real `hacfed-server` process on loopback (SuperLink, ServerApp), with two labs whose Flower
SuperNodes relay to participant services in this process: lab-a is honest, mallory sends every case
of tests/faults/hostile_cases.py that is refused before the journal records a submission, packed
into its replies. The server must keep running, answer everything, accept lab-a and (last)
mallory's own honest submission, and finish the run. A stranger's `flwr stop` of the run (issue 9,
reproduction 1) is refused on the way. The same corpus through the round driver in process, case by
case: test_hostile_corpus.py.
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from hacfed.clients.service import ParticipantService
from hacfed.envelope import DOMAIN_UPDATE, generate_key, key_id, open_envelope, save_public_key
from hacfed.exchange import open_answer, open_delivery, request_type
from hacfed.hello import HELLO_REQUEST_TYPE
from hacfed.keys import ensure_key_pair
from hacfed.server.coordinator.audit import verify_audit_log
from hacfed.wire import PayloadType, SubmissionReceipt, SubmissionRefusal, decode_round_update
from tests.faults.hostile_cases import CORPUS
from tests.faults.hostile_lab import CLOSED_CODES, Case, Ctx, HonestParticipant, Lab
from tests.federation import coordinator_toml
from tests.processes import BIN
from tests.unit.test_coordinator_fakes import TASK

pytestmark = pytest.mark.slow


SERVER_TOML = coordinator_toml("hostile-corpus", rounds=1, expected_participants=2, min_participants=1,
                               round_deadline_s=600, eval_every=0, rate_limit_burst=1000,
                               round_quota_bytes=1073741824, round_quota_trajectories=10000,
                               task={"kind": "arithmetic", "digits": 2, "num_train": 200, "num_eval": 20},
                               max_new_tokens=8)

MAX_REPLY_ITEMS = 48
MAX_REPLY_BYTES = 12 * 1024 * 1024


def _over_flower(case: Case) -> bool:
    """What mallory sends through the real deployment: every case refused before anything is
    journaled as its submission (so one lab can send them all), except the flood (it would spend
    mallory's own rate limit) and the over-cap reply (Flower's transport refuses it first:
    tests/integration/test_coordinator_exposure.py)."""
    return case.early and case.setup is None and case.name not in ("flood-64-submissions", "reply-over-16-mib")


def _mallory_replies(ctx: Ctx, cases: list[Case]) -> tuple[list[bytes], int]:
    """Mallory's replies, in order: the signed hostile items packed into LabReplies, then each
    hostile LabReply of its own; and how many refusals they must earn."""
    packed: list[list[bytes]] = [[]]
    whole: list[bytes] = []
    for case in cases:
        attack = case.build(ctx)
        if attack.outer is not None:
            whole.append(attack.outer)
            continue
        for item in attack.items:
            chunk = packed[-1]
            if chunk and (len(chunk) >= MAX_REPLY_ITEMS or sum(map(len, chunk)) + len(item) > MAX_REPLY_BYTES):
                packed.append(chunk := [])
            chunk.append(item)
    replies = [ctx.reply(tuple(chunk)) for chunk in packed if chunk] + whole
    return replies, sum(map(len, packed)) + len(whole)


class Mallory:
    """mallory's participant service: its hello and, at the end, its honest work are its real
    `ParticipantService`'s; in between, every delivery is answered with the next hostile reply."""

    def __init__(self, service: ParticipantService, lab: Lab, other: Lab, trusted: dict, cases: list[Case]) -> None:
        self.service, self.lab, self.other, self.trusted, self.cases = service, lab, other, trusted, cases
        self.replies: list[bytes] | None = None
        self.expected = 0
        self.answers: dict[bytes, SubmissionReceipt | SubmissionRefusal] = {}
        self.first_hostile_at: float | None = None
        self.errors: list[str] = []
        self._lock = threading.Lock()

    def handle(self, request: bytes) -> bytes:
        try:
            with self._lock:
                return self._handle(request)
        except Exception as exc:  # recorded for the test, then the relay reports it
            self.errors.append(repr(exc))
            raise

    def _handle(self, request: bytes) -> bytes:
        if request_type(request, (PayloadType.DELIVERY, HELLO_REQUEST_TYPE)) != PayloadType.DELIVERY:
            return self.service.handle(request)
        delivery = open_delivery(request, self.trusted)
        for raw in delivery.answers:
            self.answers.setdefault(raw, open_answer(raw, self.trusted))
        if self.replies is None and delivery.request:
            payload, _ = open_envelope(delivery.request, self.trusted, DOMAIN_UPDATE, PayloadType.ROUND_UPDATE)
            plan = decode_round_update(payload).next_plan
            self.service.handle(request)  # the honest step: its outbox keeps the honest submission
            self.replies, self.expected = _mallory_replies(Ctx(self.lab, plan, self.other, generate_key()),
                                                           self.cases)
            self.first_hostile_at = time.monotonic()
        if self.replies:
            return self.replies.pop(0)
        return self.service.handle(request)  # answers, then the honest resend from the outbox, the final report


def _wait(what: str, done: Callable[[], bool], server: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        tail = log.read_text(errors="replace")[-6000:]
        assert server.poll() is None, f"hacfed-server exited ({server.returncode}) before {what}:\n{tail}"
        assert time.monotonic() < deadline, f"no {what} within {timeout:.0f}s:\n{tail}"
        time.sleep(0.5)


def _stranger_flwr_stop(tmp_path: Path, server_dir: Path, address: str, server: subprocess.Popen,
                        log: Path) -> subprocess.CompletedProcess[str]:
    """`flwr stop <the coordinator's run id>` from a stranger's own Flower home, aimed at the address
    labs reach (the Fleet API)."""
    from hacfed.procs import flower_env

    def run_id() -> str | None:
        for path in server_dir.rglob("*.log"):
            found = re.search(r"Successfully started run (\d+)", path.read_text(errors="replace"))
            if found:
                return found.group(1)
        return None

    _wait("the coordinator's run id", lambda: run_id() is not None, server, log, 240)
    home = tmp_path / "stranger-home"
    home.mkdir()
    (home / "config.toml").write_text(f'[superlink]\ndefault = "target"\n\n[superlink.target]\n'
                                      f'address = "{address}"\ninsecure = true\n')
    return subprocess.run([str(BIN / "flwr"), "stop", run_id(), "target"], env=flower_env(home), capture_output=True,
                          text=True,
                          timeout=180, cwd=home, start_new_session=True, check=False)


def _stop(popen: subprocess.Popen) -> None:
    """SIGTERM to the process group the server leads (started with start_new_session), SIGKILL after 60 s."""
    if popen.poll() is None:
        os.killpg(popen.pid, signal.SIGTERM)
        try:
            popen.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(popen.pid, signal.SIGKILL)
            popen.wait()


@pytest.mark.timeout(900)
def test_hostile_corpus_against_a_running_hacfed_server(tmp_path: Path) -> None:
    from hacfed.clients.relay import serve_participant
    from hacfed.clients.supernode import start_supernode
    from hacfed.procs import ProcessSupervisor

    cases = [c for c in CORPUS if _over_flower(c)]
    assert len(cases) >= 40
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    (tmp_path / "coordinator.toml").write_text(SERVER_TOML)
    server_dir, log = tmp_path / "server", tmp_path / "server.log"
    argv = [str(BIN / "hacfed-server"), "--config", str(tmp_path / "coordinator.toml"), "--insecure",
            "--listen", "127.0.0.1:0", "--state-dir", str(server_dir), "--metrics-out", str(tmp_path / "metrics.jsonl")]
    started = time.monotonic()
    with open(log, "wb") as out:
        server = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path, start_new_session=True,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1"})
    grpc_servers = []
    try:
        _wait("the ready line", lambda: "ready: Fleet API on" in log.read_text(errors="replace"), server, log, 240)
        address = re.search(r"ready: Fleet API on (127\.0\.0\.1:\d+)", log.read_text()).group(1)
        stop = _stranger_flwr_stop(tmp_path, server_dir, address, server, log)
        coordinator_public = ensure_key_pair(server_dir, "coordinator").load().public_key()
        trusted = {key_id(coordinator_public): coordinator_public}
        labs = {pid: Lab(pid, generate_key()) for pid in ("lab-a", "mallory")}
        for lab in labs.values():  # the operator registers both labs (plaintext: no SuperNode key needed)
            save_public_key(lab.key.public_key(), server_dir / "keys" / f"{lab.pid}.pub")
        honest = ParticipantService(HonestParticipant("lab-a"), TASK, labs["lab-a"].key, coordinator_public,
                                    tmp_path / "lab-a")
        mallory = Mallory(ParticipantService(HonestParticipant("mallory"), TASK, labs["mallory"].key,
                                             coordinator_public, tmp_path / "mallory"),
                          labs["mallory"], labs["lab-a"], trusted, cases)
        with ProcessSupervisor(grace_s=10.0) as sup:
            for pid, handler in (("lab-a", honest.handle), ("mallory", mallory.handle)):
                grpc_server, port = serve_participant(handler)
                grpc_servers.append(grpc_server)
                start_supernode(sup, tmp_path / f"{pid}-node", superlink_address=address, idle_poll_s=0.5,
                                node_config={"participant-id": pid, "participant-address": f"127.0.0.1:{port}"})
            deadline = time.monotonic() + 600
            while server.poll() is None and time.monotonic() < deadline:
                time.sleep(0.5)
            ended = time.monotonic()
        text = log.read_text(errors="replace")
        assert server.returncode == 0, text[-6000:]
    finally:
        _stop(server)
        for grpc_server in grpc_servers:
            grpc_server.stop(0).wait()

    # issue 9, reproduction 1: a stranger who reaches the coordinator could `flwr stop` its run. The
    # Fleet API is all it reaches now: the stop is refused and the run went on to the end (above).
    assert stop.returncode != 0 and not re.search(r"successfully stopped", stop.stdout + stop.stderr, re.I), \
        stop.stdout + stop.stderr
    assert not mallory.errors, mallory.errors
    assert mallory.replies == [] and mallory.expected >= len(cases)
    assert "Traceback" not in text and "federation finished: 1 rounds, final reports from ['lab-a', 'mallory']" in text
    answers = list(mallory.answers.values())
    refusals = [a for a in answers if isinstance(a, SubmissionRefusal)]
    receipts = [a for a in answers if isinstance(a, SubmissionReceipt)]
    codes = {a.code for a in refusals}
    assert codes <= CLOSED_CODES and codes <= set().union(*(c.allowed() for c in cases)), codes
    assert {c.must for c in cases} <= codes, {c.must for c in cases} - codes
    # mallory's own honest submission, resent from its outbox after the corpus, and lab-a's: accepted
    assert [len(r.accepted_trajectory_ids) for r in receipts] == [4] and not receipts[0].rejections
    assert mallory.service.finished and honest.finished
    with sqlite3.connect(f"file:{server_dir / 'journal.sqlite'}?mode=ro", uri=True) as db:
        rejected = db.execute("SELECT COUNT(*) FROM rejections").fetchone()[0]
        by_source = dict(db.execute("SELECT participant_id, COUNT(*) FROM trajectories GROUP BY participant_id"))
        close = db.execute("SELECT close_reason FROM rounds WHERE round_id = 0").fetchone()[0]
    assert rejected == mallory.expected  # every hostile item and reply refused exactly once, nothing else
    assert by_source == {"lab-a": 4, "mallory": 4} and close == "quorum"
    assert verify_audit_log(server_dir / "audit.log").ok
    assert {p.pid for p in psutil.Process().children(recursive=True)
            if p.status() != psutil.STATUS_ZOMBIE} - before == set()
    print(f"\nhostile corpus against hacfed-server: {len(cases)} cases in {mallory.expected} refused items/replies, "
          f"{len(refusals)} distinct signed refusals, codes {sorted(codes)}; the corpus and mallory's honest "
          f"resend took {ended - (mallory.first_hostile_at or ended):.1f}s of a {ended - started:.1f}s run; the "
          f"stranger's flwr stop exited {stop.returncode}: "
          f"{[x.strip(' │╭╮╰╯─') for x in (stop.stdout + stop.stderr).splitlines() if re.search('[A-Za-z]', x)][-2:]}")
