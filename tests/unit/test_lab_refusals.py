"""A lab the coordinator cannot take as it is learns it at once and stops; the coordinator stops
waiting for it (issue 43): a lab on another task (HACFED-E-TASK-MISMATCH) and a lab whose id is
not registered (HACFED-E-UNKNOWN-PARTICIPANT). Driver and participant services in one process
(tests/unit/test_server_driver.py's `Federation`); the real processes: tests/integration/
test_task_example_readme.py."""

from __future__ import annotations

from pathlib import Path

from hacfed.clients.service import ParticipantService
from hacfed.envelope import save_public_key
from hacfed.keys import ensure_key_pair
from hacfed.tasks.arithmetic import ArithmeticTask
from tests.unit.test_coordinator_fakes import TASK, FakeClock
from tests.unit.test_server_driver import Federation, ScriptedParticipant


def _lab_on_another_task(fed: Federation, node: int, pid: str, refusals: list[str]) -> None:
    keys = ensure_key_pair(fed.tmp / pid, "participant")
    save_public_key(keys.load().public_key(), fed.keys_dir / f"{pid}.pub")
    service = ParticipantService(ScriptedParticipant(pid), ArithmeticTask(digits=3, num_train=200, num_eval=20),
                                 keys.load(), fed.coordinator_key.load().public_key(), fed.tmp / pid / "service",
                                 on_refused=refusals.append)
    fed.nodes[node] = (pid, service)


def test_a_lab_on_another_task_is_told_once_and_no_round_waits_for_it(tmp_path: Path) -> None:
    fed = Federation(tmp_path, FakeClock(), rounds=3, expected_participants=3, min_participants=2)
    fed.add(1, "lab-a")
    fed.add(2, "lab-b")
    refusals: list[str] = []
    _lab_on_another_task(fed, 3, "lab-m", refusals)
    before = fed.clock.t
    outcome = fed.exchange()  # round 0 goes to all three; lab-m refuses its plan
    assert outcome[1] == outcome[2] == "reply" and outcome[3].startswith("HACFED-E-TASK-MISMATCH: task mismatch")
    assert len(refusals) == 1 and refusals[0].startswith("task mismatch: plan prompt 'add2:") \
        and "arith-add3" in refusals[0], refusals
    coordinator = fed.driver.coordinator
    assert coordinator.current_round is None, "round 0 still waits for the lab on another task"
    assert coordinator.round_record(0).close_reason == "quorum" and fed.clock.t == before
    assert any(line.startswith("lab-m is on another task (HACFED-E-TASK-MISMATCH") for line in fed.lines), fed.lines
    assert 3 not in (fed.driver.next_round(fed.identified()) or {})  # round 1: sent nothing more
    assert coordinator.awaited() == {"lab-a", "lab-b"}


def test_a_lab_on_another_task_that_says_hello_again_is_counted_on_again(tmp_path: Path) -> None:
    fed = Federation(tmp_path, FakeClock(), rounds=3, expected_participants=2, min_participants=2)
    fed.add(1, "lab-a")
    _lab_on_another_task(fed, 2, "lab-m", [])
    fed.exchange()
    assert fed.driver.coordinator.withdrawn == {"lab-m"}
    fed.mapped.pop(2)  # lab-m restarted (on the right task): a new node, a new hello
    fed.add(2, "lab-m")
    fed.identified()
    assert fed.driver.coordinator.withdrawn == frozenset()


def test_a_lab_that_is_not_registered_is_told_so_with_its_next_hello(tmp_path: Path) -> None:
    fed = Federation(tmp_path, FakeClock(), rounds=2, expected_participants=1)
    refusals: list[str] = []
    keys = ensure_key_pair(fed.tmp / "lab-x", "participant")  # never registered
    fed.nodes[5] = ("lab-x", ParticipantService(ScriptedParticipant("lab-x"), TASK,
                                                keys.load(), fed.coordinator_key.load().public_key(),
                                                fed.tmp / "lab-x" / "service", on_refused=refusals.append))
    assert fed.identified() == {} and refusals == []  # the first hello: refused
    assert fed.identified() == {}  # the hello the ServerApp sends again at once carries the notice
    assert refusals == ["the coordinator refused this lab (HACFED-E-UNKNOWN-PARTICIPANT): lab-x is not registered "
                        "with this coordinator: the operator registers a lab with hacfed-server register <its "
                        "enrolment.txt> (hacfed-client keys prints it)"], refusals

