"""hacfed-server under a lab that floods its replies while several rounds are open (issue 42).

A real `hacfed-server` (SuperLink, ServerApp) with `max_staleness = 2` (K: up to 3 rounds open at
once), two labs whose Flower SuperNodes relay to participant services in this process:

- lab-a is honest and slow (each step takes STEP_S);
- flood answers every delivery at once with one reply packed with FLOOD_EACH signed, well-formed
  submissions of this run for every round it has been sent so far (the open ones, and the closed
  ones again and again), its own valid submission for the requested round last; its final report is
  honest, so the run can end. The coordinator's rate limit refuses most of it (its own submissions
  too, mostly), so the rounds wait for flood until their deadline (quorum 1) while lab-a runs ahead by
  up to K rounds.

Checked: hacfed-server finishes every round and exits 0 with no traceback; at some moment at least two
rounds were open; every round holds lab-a's samples and at most one submission of flood's; flood got
signed refusals for the rest; the journal passes `integrity_check` and the audit log verifies.
"""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest

from hacfed.clients.service import ParticipantService
from hacfed.envelope import DOMAIN_UPDATE, EnvelopeError, generate_key, key_id, open_envelope, save_public_key
from hacfed.exchange import open_answer, open_delivery, request_type
from hacfed.hello import HELLO_REQUEST_TYPE
from hacfed.keys import ensure_key_pair
from hacfed.messages import RoundPlan
from hacfed.server.coordinator.audit import verify_audit_log
from hacfed.wire import PayloadType, SubmissionRefusal, decode_round_update
from tests.faults.hostile_lab import Ctx, HonestParticipant, Lab
from tests.faults.test_hostile_server import _stop, _wait
from tests.federation import coordinator_toml
from tests.processes import BIN
from tests.unit.test_coordinator_fakes import TASK

pytestmark = [pytest.mark.slow, pytest.mark.long]  # a check of behaviour held as it was: the long tier

ROUNDS = 4
K = 2
STEP_S = 3.0  # lab-a's step: a few exchanges of flood's in each
FLOOD_EACH = 8  # submissions per round flood has been sent, in every reply
SERVER_TOML = coordinator_toml("flood-staleness", rounds=ROUNDS, max_staleness=K, expected_participants=2,
                               min_participants=1, round_deadline_s=20, eval_every=0,
                               task={"kind": "arithmetic", "digits": 2, "num_train": 200, "num_eval": 20},
                               max_new_tokens=8)


class SlowHonest(HonestParticipant):
    def step(self, update, before_checkpoint=None):  # noqa: ANN001, ANN201 - HonestParticipant's
        time.sleep(STEP_S)
        return super().step(update, before_checkpoint)


class Flood:
    """flood's participant service: hellos and the final report are its honest service's; every
    other delivery is answered with a flood of submissions for every round it was sent."""

    def __init__(self, service: ParticipantService, lab: Lab, other: Lab, trusted: dict) -> None:
        self.service, self.lab, self.other, self.trusted = service, lab, other, trusted
        self.plans: dict[int, RoundPlan] = {}
        self.sent = 0
        self.refusals: list[SubmissionRefusal] = []
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
            answer = open_answer(raw, self.trusted)
            if isinstance(answer, SubmissionRefusal):
                self.refusals.append(answer)
        plan = None
        if delivery.request:
            try:
                payload, _ = open_envelope(delivery.request, self.trusted, DOMAIN_UPDATE, PayloadType.ROUND_UPDATE)
            except EnvelopeError:  # the final acknowledgement
                return self.service.handle(request)
            plan = decode_round_update(payload).next_plan
            if plan is None:  # the final update: flood's honest final report ends its run
                return self.service.handle(request)
            self.plans[plan.round_id] = plan
        if not self.plans:
            return self.service.handle(request)
        items = [self._sealed(p) for p in self.plans.values() for _ in range(FLOOD_EACH)]
        items.append(self._sealed(plan or max(self.plans.values(), key=lambda p: p.round_id)))
        self.sent += len(items)
        return Ctx(self.lab, next(iter(self.plans.values())), self.other, generate_key()).reply(tuple(items))

    def _sealed(self, plan: RoundPlan) -> bytes:
        ctx = Ctx(self.lab, plan, self.other, generate_key())
        return ctx.sealed(ctx.submission())


@pytest.mark.timeout(900)
def test_a_lab_flooding_its_replies_at_k2_leaves_the_run_whole(tmp_path: Path) -> None:
    from hacfed.clients.relay import serve_participant
    from hacfed.clients.supernode import start_supernode
    from hacfed.procs import ProcessSupervisor

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    (tmp_path / "coordinator.toml").write_text(SERVER_TOML)
    server_dir, log = tmp_path / "server", tmp_path / "server.log"
    argv = [str(BIN / "hacfed-server"), "--config", str(tmp_path / "coordinator.toml"), "--insecure",
            "--listen", "127.0.0.1:0", "--state-dir", str(server_dir)]
    with open(log, "wb") as out:
        server = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path, start_new_session=True,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1"})
    grpc_servers = []
    try:
        _wait("the ready line", lambda: "ready: Fleet API on" in log.read_text(errors="replace"), server, log, 240)
        address = re.search(r"ready: Fleet API on (127\.0\.0\.1:\d+)", log.read_text()).group(1)
        coordinator_public = ensure_key_pair(server_dir, "coordinator").load().public_key()
        trusted = {key_id(coordinator_public): coordinator_public}
        labs = {pid: Lab(pid, generate_key()) for pid in ("lab-a", "flood")}
        for lab in labs.values():  # the operator registers both labs (plaintext: no SuperNode key needed)
            save_public_key(lab.key.public_key(), server_dir / "keys" / f"{lab.pid}.pub")
        honest = ParticipantService(SlowHonest("lab-a"), TASK, labs["lab-a"].key, coordinator_public,
                                    tmp_path / "lab-a")
        flood = Flood(ParticipantService(HonestParticipant("flood"), TASK, labs["flood"].key, coordinator_public,
                                         tmp_path / "flood"), labs["flood"], labs["lab-a"], trusted)
        with ProcessSupervisor(grace_s=10.0) as sup:
            for pid, handler in (("lab-a", honest.handle), ("flood", flood.handle)):
                grpc_server, port = serve_participant(handler)
                grpc_servers.append(grpc_server)
                start_supernode(sup, tmp_path / f"{pid}-node", superlink_address=address, idle_poll_s=0.5,
                                node_config={"participant-id": pid, "participant-address": f"127.0.0.1:{port}"})
            deadline = time.monotonic() + 600
            while server.poll() is None and time.monotonic() < deadline:
                time.sleep(0.5)
        text = log.read_text(errors="replace")
        assert server.returncode == 0, text[-6000:]
    finally:
        _stop(server)
        for grpc_server in grpc_servers:
            grpc_server.stop(0).wait()

    assert "Traceback" not in text and f"federation finished: {ROUNDS} rounds" in text, text[-6000:]
    assert not flood.errors, flood.errors
    with sqlite3.connect(f"file:{server_dir / 'journal.sqlite'}?mode=ro", uri=True) as db:
        rounds = db.execute("SELECT round_id, opened_at, closed_at FROM rounds ORDER BY round_id").fetchall()
        lab_a = dict(db.execute("SELECT round_id, COUNT(*) FROM trajectories WHERE participant_id='lab-a' "
                                "GROUP BY round_id"))
        flood_subs = dict(db.execute("SELECT round_id, COUNT(*) FROM submissions WHERE participant_id='flood' "
                                     "GROUP BY round_id"))
        refused = db.execute("SELECT COUNT(*) FROM rejections WHERE participant_id='flood'").fetchone()[0]
        (integrity,), = db.execute("PRAGMA integrity_check").fetchall()
    assert [r for r, _, _ in rounds] == list(range(ROUNDS))
    overlapping = [r for (r, _, closed), (_, opened, _) in zip(rounds, rounds[1:]) if opened < closed]
    assert overlapping, rounds  # K acted: a round opened while the one before was still open
    assert sorted(lab_a) == list(range(ROUNDS)) and all(n == 4 for n in lab_a.values()), lab_a
    assert all(n <= 1 for n in flood_subs.values()), flood_subs
    assert refused > 0 and flood.refusals and flood.sent > ROUNDS * FLOOD_EACH, (refused, flood.sent)
    assert integrity == "ok" and verify_audit_log(server_dir / "audit.log").ok
    assert {p.pid for p in psutil.Process().children(recursive=True)
            if p.status() != psutil.STATUS_ZOMBIE} - before == set()
    codes = sorted({r.code for r in flood.refusals})
    print(f"\nflood sent {flood.sent} submissions in its replies; {refused} refused in the journal, codes {codes}; "
          f"rounds open together: {overlapping}")
