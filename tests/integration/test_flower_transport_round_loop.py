"""Flower transport, the ServerApp round loop (`hacfed.server.serverapp.RoundLoop`) against an
in-memory Grid: discovery and hello of nodes, routing of replies and errors, late joiners.
"""

from __future__ import annotations

import pytest

from hacfed.server.serverapp import EXCHANGE_TYPE, HELLO_TYPE, RoundLoop
from tests.integration.flower_transport_helpers import FakeGrid, RecordingDriver, echo_node, loop_timing


def test_round_loop_discovers_nodes_and_routes_replies_and_errors() -> None:
    nodes = {11: echo_node("lab-a"), 12: echo_node("lab-b", silent=True), 13: echo_node("lab-c", flower_error=True)}
    grid = FakeGrid(lambda n, m: nodes[n](m))
    grid.nodes = [11, 12, 13]
    driver = RecordingDriver(rounds=2, quorum=3)
    loop = RoundLoop(grid, driver, loop_timing())  # type: ignore[arg-type]
    loop.run()
    assert loop.participants == {11: "lab-a", 12: "lab-b", 13: "lab-c"}
    for r in (1, 2):
        events = {(n, kind, value) for (rnd, kind, n, value) in driver.log if rnd == r}
        assert events == {
            (11, "reply", f"R{r}-LAB-A".encode()),
            (12, "error", "HACFED-E-ROUND-DEADLINE"),
            (13, "error", "HACFED-E-FLOWER-NODE_UNAVAILABLE"),
        }
    exchanges = [m for m in grid.sent if m.metadata.message_type == EXCHANGE_TYPE]
    assert sorted({m.metadata.group_id for m in exchanges}) == ["1", "2"]
    assert all(m.metadata.ttl == pytest.approx(0.3) for m in exchanges)


def test_late_node_joins_from_the_next_round_and_anonymous_nodes_are_left_out() -> None:
    nodes = {1: echo_node("lab-a"), 2: echo_node("lab-b"), 3: echo_node(None)}
    grid = FakeGrid(lambda n, m: nodes[n](m))
    grid.nodes = [1, 3]
    driver = RecordingDriver(rounds=3, quorum=1)

    def node_joins(round_number: int) -> None:
        if round_number == 1:
            grid.nodes.append(2)

    driver.on_next_round = node_joins
    RoundLoop(grid, driver, loop_timing(round_timeout_s=1.0)).run()  # type: ignore[arg-type]
    by_round = {r: sorted(n for (rnd, kind, n, _) in driver.log if rnd == r and kind == "reply") for r in (1, 2, 3)}
    assert by_round[1] == [1]
    assert by_round[3] == [1, 2]
    assert all(n != 3 for (_, _, n, _) in driver.log)


def test_a_node_the_driver_does_not_identify_is_never_sent_a_round() -> None:
    nodes = {1: echo_node("lab-a"), 2: echo_node("impostor")}
    grid = FakeGrid(lambda n, m: nodes[n](m))
    grid.nodes = [1, 2]
    driver = RecordingDriver(rounds=20, quorum=1)
    loop = RoundLoop(grid, driver, loop_timing(hello_timeout_s=0.001))  # type: ignore[arg-type]
    loop.run()
    assert loop.participants == {1: "lab-a"}
    assert not [m for m in grid.sent if m.metadata.message_type == EXCHANGE_TYPE and m.metadata.dst_node_id == 2]
    hellos_to_2 = [m for m in grid.sent if m.metadata.message_type == HELLO_TYPE and m.metadata.dst_node_id == 2]
    assert len(hellos_to_2) >= 2  # asked again after hello_timeout_s (it may have been registered since)
    assert all(m.content["hacfed"]["payload"] == b"challenge" for m in hellos_to_2)  # the driver's hello payload


def test_driver_payload_for_unknown_node_is_a_bug_not_a_silent_skip() -> None:
    grid = FakeGrid(lambda n, m: echo_node("lab-a")(m))
    grid.nodes = [1]
    loop = RoundLoop(grid, RecordingDriver(1, 1), loop_timing())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"unknown node ids \[99\]"):
        loop.send({99: b"x"})

