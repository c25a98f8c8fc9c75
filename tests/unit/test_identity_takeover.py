"""Identity takeover through the hello (issue 9, reproduction 2; security.md T5, S1, S2).

The real ServerApp round loop (`RoundLoop`) and the real round driver, with the real ClientApp
handlers (`hacfed.clients.clientapp.hello` / `exchange`) relaying to real participant services on
loopback gRPC; only Flower's transport is an in-memory grid. Before the fix, an unregistered node
that said hello as `lab-a` after lab-a did took lab-a's place: it received lab-a's signed round
update (from round 1 on, the pool of everyone's rollouts) and its junk reply got lab-a refused.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from flwr.app import Context, Message, RecordDict

from hacfed.clients import clientapp
from hacfed.clients.relay import serve_participant
from hacfed.clients.service import ParticipantService
from hacfed.envelope import save_public_key
from hacfed.keys import ensure_key_pair
from hacfed.server.config import ServerConfig, ServerSettings
from hacfed.server.driver import FederationDriver
from hacfed.server.serverapp import HELLO_TYPE, LoopTiming, RoundLoop
from tests.integration.flower_transport_helpers import FakeGrid
from tests.unit.test_coordinator_fakes import TASK, make_config
from tests.unit.test_server_driver import ScriptedParticipant


@dataclass
class Lab:
    node_id: int
    participant_id: str  # what its node config (and so its hello) says
    participant: ScriptedParticipant
    port: int


@dataclass
class Deployment:
    driver: FederationDriver
    grid: FakeGrid
    labs: dict[int, Lab]
    lines: list[str]

    def loop(self) -> RoundLoop:
        timing = LoopTiming(poll_interval_s=0.01, round_timeout_s=5.0, hello_timeout_s=5.0, discovery_interval_s=0.01)
        return RoundLoop(self.grid, self.driver, timing)  # type: ignore[arg-type]


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    """lab-a (node 1) and lab-b (node 2) registered; node 3 is a stranger's, configured as lab-a,
    with a key of its own; it is discovered last, as an attacker who joins after lab-a would be."""
    state = tmp_path / "server"
    coordinator = ensure_key_pair(state, "coordinator")
    keys_dir = state / "keys"
    keys_dir.mkdir(parents=True)
    cfg = make_config(state, rounds=2, group_size=2, expected_participants=2, min_participants=2,
                      round_deadline_s=5.0, max_deadline_extensions=0)
    settings = ServerConfig(cfg, ServerSettings(insecure=True, retry_interval_s=0.5), state)
    lines: list[str] = []
    labs: dict[int, Lab] = {}
    servers = []
    for node_id, pid, home, registered in ((1, "lab-a", "lab-a", True), (2, "lab-b", "lab-b", True),
                                           (3, "lab-a", "stranger", False)):
        key = ensure_key_pair(tmp_path / home, "participant").load()
        if registered:
            save_public_key(key.public_key(), keys_dir / f"{pid}.pub")
        participant = ScriptedParticipant(pid)
        service = ParticipantService(participant, TASK, key, coordinator.load().public_key(), tmp_path / home / "svc")
        server, port = serve_participant(service.handle)
        servers.append(server)
        labs[node_id] = Lab(node_id, pid, participant, port)

    def respond(node_id: int, msg: Message) -> Message:
        lab = labs[node_id]
        context = Context(run_id=1, node_id=node_id, state=RecordDict(), run_config={"relay-timeout-s": 30.0},
                          node_config={"participant-id": lab.participant_id,
                                       "participant-address": f"127.0.0.1:{lab.port}"})
        handler = clientapp.hello if msg.metadata.message_type == HELLO_TYPE else clientapp.exchange
        return handler(msg, context)

    grid = FakeGrid(respond)
    grid.nodes = [1, 2, 3]
    driver = FederationDriver(settings, console=lines.append)
    try:
        yield Deployment(driver, grid, labs, lines)
    finally:
        driver.journal.close()
        for server in servers:
            server.stop(0).wait()


@pytest.mark.timeout(120)
def test_unregistered_node_saying_hello_as_a_registered_lab_gets_nothing(deployment: Deployment) -> None:
    deployment.loop().run()
    stranger, lab_a = deployment.labs[3].participant, deployment.labs[1].participant
    assert stranger.updates == [], "the stranger's node received lab-a's round updates (and pools)"
    assert [u.next_plan.round_id for u in lab_a.updates if u.next_plan] == [0, 1]  # lab-a took part in every round
    journal = deployment.driver.journal
    assert all(journal.round(r).close_reason == "quorum" for r in (0, 1))  # no round waited for its deadline
    assert any(line.startswith("REFUSED node 3 as participant lab-a: its hello is not signed with the registered "
                               "key of lab-a") for line in deployment.lines)


@pytest.mark.timeout(120)
def test_the_stranger_never_gets_lab_a_refused(deployment: Deployment) -> None:
    deployment.loop().run()
    with sqlite3.connect(deployment.driver.cfg.journal_path) as db:
        refused = db.execute("SELECT COUNT(*) FROM rejections WHERE participant_id = 'lab-a'").fetchone()[0]
        accepted = db.execute("SELECT COUNT(*) FROM trajectories WHERE participant_id = 'lab-a'").fetchone()[0]
    assert refused == 0
    assert accepted == 2 * 2 * 2  # 2 rounds x 2 prompts x G=2, all of lab-a's own
