"""The ServerApp's round loop (server/serverapp.py `RoundLoop.run`) with a stand-in grid and driver:
no SuperLink, real Flower `Message`s."""

from __future__ import annotations

import weakref

import pytest

from hacfed.server.serverapp import LoopTiming, RoundLoop, driver_spec, load_driver


class Payloads(dict):
    """A round's payloads, as a type a weak reference can follow."""


class Driver:
    """Two rounds of one node's payload; records whether the last round's payloads were still
    alive when the next round was asked for."""

    def __init__(self) -> None:
        self.rounds = 0
        self.previous: weakref.ref[Payloads] | None = None
        self.alive_at_next_round: list[bool] = []
        self.errors: list[tuple[int, str]] = []

    def finished(self) -> bool:
        return self.rounds >= 2

    def next_round(self, participants):
        if self.previous is not None:
            self.alive_at_next_round.append(self.previous() is not None)
        self.rounds += 1
        payloads = Payloads({node: b"delivery %d" % self.rounds for node in participants})
        self.previous = weakref.ref(payloads)
        return payloads

    def on_error(self, node_id: int, error: str) -> None:
        self.errors.append((node_id, error))

    def close_round(self) -> None:
        pass


class Grid:
    """One node that is always online; every push is refused, so each round ends at once."""

    def __init__(self) -> None:
        self.pushed: list[bytes] = []

    def get_node_ids(self):
        return [7]

    def push_messages(self, messages):
        self.pushed.extend(m.content["hacfed"]["payload"] for m in messages)
        return ["" for _ in messages]

    def pull_messages(self, ids):
        return []


def test_a_rounds_deliveries_are_let_go_before_the_next_round_is_built() -> None:
    driver, grid = Driver(), Grid()
    loop = RoundLoop(grid, driver, LoopTiming(0.01, 5.0, 5.0, 60.0))
    loop.participants[7] = "lab-a"
    loop.run()
    assert grid.pushed == [b"delivery 1", b"delivery 2"]
    assert [e[0] for e in driver.errors] == [7, 7]  # each refused push reached the driver
    assert driver.alive_at_next_round == [False]  # round 1's payloads were gone when round 2 was built


class _Reply:
    """What `parse_reply` reads of a relay's reply Message: its content, type and the message it answers."""

    def __init__(self, reply_to: str, payload: bytes) -> None:
        from flwr.app import ConfigRecord, RecordDict

        from hacfed.server.serverapp import EXCHANGE_TYPE, PAYLOAD_KEY, RECORD_NAME

        self.content = RecordDict({RECORD_NAME: ConfigRecord({PAYLOAD_KEY: payload})})
        self.metadata = type("Metadata", (), {"reply_to_message_id": reply_to, "message_type": EXCHANGE_TYPE})()

    def has_error(self) -> bool:
        return False


class AnsweringGrid(Grid):
    """Three nodes; every pushed message is answered, all three answers in the first pull."""

    def get_node_ids(self):
        return [1, 2, 3]

    def push_messages(self, messages):
        super().push_messages(messages)
        self.ids = [f"m{m.metadata.dst_node_id}" for m in messages]
        return self.ids

    def pull_messages(self, ids):
        return [_Reply(i, b"reply to " + i.encode()) for i in ids]


class BatchRecordingDriver(Driver):
    def __init__(self) -> None:
        super().__init__()
        self.pulls: list[list[tuple[int, bytes]]] = []

    def finished(self) -> bool:
        return self.rounds >= 1

    def on_replies(self, replies) -> None:
        self.pulls.append(list(replies))


def test_the_replies_of_one_pull_reach_the_driver_together_in_the_order_pulled() -> None:
    """The driver judges a pull's submissions overlapped (`FederationDriver.on_replies`): the loop
    must hand them over together, not one call per reply."""
    driver, grid = BatchRecordingDriver(), AnsweringGrid()
    loop = RoundLoop(grid, driver, LoopTiming(0.01, 5.0, 5.0, 60.0))
    loop.participants.update({1: "lab-a", 2: "lab-b", 3: "lab-c"})
    loop.run()
    assert driver.pulls == [[(1, b"reply to m1"), (2, b"reply to m2"), (3, b"reply to m3")]]
    assert driver.errors == []


class Timeless(Driver):
    """A driver without the loop's `timing`."""

    def on_replies(self, replies) -> None:
        pass

    def hello(self, node_id: int) -> bytes:
        return b""

    def identify(self, node_id: int, participant_id: str, proof: bytes) -> bool:
        return True


def make_timeless(run_config) -> Timeless:
    return Timeless()


def make_timed(run_config) -> Timeless:
    driver = Timeless()
    driver.timing = LoopTiming(0.5, 9.0)  # type: ignore[attr-defined]
    return driver


def test_the_run_config_names_the_driver_and_the_driver_brings_its_timing() -> None:
    for bad in ("", "module", ":f", "module:", 3):
        with pytest.raises(ValueError, match=f"run config 'driver' must be 'package.module:factory', got {bad!r}"):
            driver_spec({"driver": bad})
    spec = driver_spec({"driver": f"{__name__}:make_timeless"})
    with pytest.raises(ValueError, match=r"built a Timeless without timing \(a LoopTiming\)"):
        load_driver(spec, {})
    timed = load_driver(f"{__name__}:make_timed", {})
    assert timed.timing == LoopTiming(0.5, 9.0, hello_timeout_s=60.0, discovery_interval_s=1.0)


def test_the_federation_driver_times_the_loop_from_its_config(tmp_path) -> None:
    from tests.unit.test_coordinator_fakes import FakeClock
    from tests.unit.test_server_driver import Federation

    fed = Federation(tmp_path, FakeClock(), round_deadline_s=42.0)
    assert fed.driver.timing == LoopTiming(poll_interval_s=0.05, round_timeout_s=42.0)


class StreamingGrid(Grid):
    """Nodes 1 and 2; node 1 answers each message at the next pull, node 2 never answers."""

    def __init__(self) -> None:
        super().__init__()
        self.to: list[int] = []
        self.waiting: list[str] = []

    def get_node_ids(self):
        return [1, 2]

    def push_messages(self, messages):
        ids = []
        for m in messages:
            ids.append(f"m{len(self.pushed)}")
            self.pushed.append(m.content["hacfed"]["payload"])
            self.to.append(m.metadata.dst_node_id)
            if m.metadata.dst_node_id == 1:
                self.waiting.append(ids[-1])
        return ids

    def pull_messages(self, ids):
        replies, self.waiting = [_Reply(i, b"reply") for i in self.waiting if i in ids], []
        return replies


class StreamingDriver:
    """Sends each idle node its next payload: node 1 three, node 2 one; done once node 1 replied three
    times and node 2's exchange ran out."""

    def __init__(self) -> None:
        self.sent = {1: 0, 2: 0}
        self.busy: set[int] = set()
        self.replied: list[int] = []
        self.errors: list[tuple[int, str]] = []
        self.closes = 0

    def finished(self) -> bool:
        return self.replied.count(1) == 3 and bool(self.errors)

    def next_round(self, participants):
        out = {}
        for node in participants:
            if node not in self.busy and self.sent[node] < (3 if node == 1 else 1):
                out[node] = b"step %d" % self.sent[node]
                self.sent[node] += 1
                self.busy.add(node)
        return out

    def on_replies(self, replies) -> None:
        for node, _ in replies:
            self.busy.discard(node)
            self.replied.append(node)

    def on_error(self, node_id: int, error: str) -> None:
        self.busy.discard(node_id)
        self.errors.append((node_id, error))

    def close_round(self) -> None:
        self.closes += 1


def test_a_streaming_loop_sends_a_lab_its_next_exchange_while_another_is_out() -> None:
    """Each exchange stands alone (labs at their own steps, max_staleness K >= 1): node 1 gets its second
    and third payloads while node 2's first is still unanswered, which then runs out on its own."""
    driver, grid = StreamingDriver(), StreamingGrid()
    loop = RoundLoop(grid, driver, LoopTiming(0.01, 0.5, 5.0, 60.0))
    loop.participants.update({1: "lab-a", 2: "lab-b"})
    loop.run()
    assert list(zip(grid.to, grid.pushed)) == [(1, b"step 0"), (2, b"step 0"), (1, b"step 1"), (1, b"step 2")]
    assert driver.replied == [1, 1, 1]
    assert driver.errors == [(2, "HACFED-E-ROUND-DEADLINE: no reply within 0.5s")]
    assert driver.closes >= 3


class LateGrid(Grid):
    """Node 1; its reply to the first message comes only after a second message was pushed to it."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []
        self.asked: list[list[str]] = []

    def get_node_ids(self):
        return [1]

    def push_messages(self, messages):
        super().push_messages(messages)
        self.ids += [f"m{len(self.ids) + i}" for i in range(len(messages))]
        return self.ids[-len(messages):]

    def pull_messages(self, ids):
        self.asked.append(list(ids))
        return [_Reply(i, b"reply to " + i.encode()) for i in ids if len(self.ids) == 2]


class SupersedingDriver:
    """Sends node 1 an exchange, lets it go (as a closed round's), sends it another at the next poll,
    and is done once a reply came."""

    def __init__(self) -> None:
        self.polls = 0
        self.replies: list[tuple[int, bytes]] = []
        self.errors: list[tuple[int, str]] = []

    def finished(self) -> bool:
        return bool(self.replies)

    def next_round(self, participants):
        self.polls += 1
        return {1: b"step %d" % self.polls} if self.polls <= 2 else None

    def on_replies(self, replies) -> None:
        self.replies += replies

    def on_error(self, node_id: int, error: str) -> None:
        self.errors.append((node_id, error))

    def close_round(self) -> None:
        pass


def test_a_new_exchange_to_a_node_supersedes_its_old_one_whose_reply_is_never_pulled() -> None:
    """A node sent anew (its old exchange's round closed) may still answer the old message: that
    reply must not reach the driver as the reply to the new exchange, so the old one is dropped."""
    driver, grid = SupersedingDriver(), LateGrid()
    loop = RoundLoop(grid, driver, LoopTiming(0.01, 5.0, 5.0, 60.0))
    loop.participants[1] = "lab-a"
    loop.run()
    assert grid.pushed == [b"step 1", b"step 2"]
    assert grid.asked[-1] == ["m1"]  # only the new exchange is pulled
    assert driver.replies == [(1, b"reply to m1")]
    assert driver.errors == []  # the superseded exchange gets no error either: the driver let it go


class HelloGrid:
    """One node (7) that answers every hello at once as lab-x; replies are Flower `Message`s."""

    def __init__(self) -> None:
        self.hellos: list[tuple[float, bytes]] = []  # (loop clock, payload) of each hello pushed
        self._replies: list = []
        self.clock = 0.0

    def get_node_ids(self):
        return [7]

    def push_messages(self, messages):
        from flwr.app import ConfigRecord, Message, RecordDict
        from flwr.common import Metadata

        ids = []
        for m in messages:
            msg_id = f"m{len(self.hellos)}"
            self.hellos.append((self.clock, m.content["hacfed"]["payload"]))
            meta = Metadata(run_id=1, message_id=f"r{msg_id}", src_node_id=7, dst_node_id=0,
                            reply_to_message_id=msg_id, group_id="hello", created_at=0.0, ttl=60.0,
                            message_type=m.metadata.message_type)
            content = RecordDict({"hacfed": ConfigRecord({"participant-id": "lab-x", "payload": b"proof"})})
            self._replies.append(Message(content=content, metadata=meta))
            ids.append(msg_id)
        return ids

    def pull_messages(self, ids):
        out, self._replies = [r for r in self._replies if r.metadata.reply_to_message_id in ids], []
        return out


class RefusingDriver:
    """Refuses every node (as the coordinator refuses a lab whose id is not registered)."""

    timing = LoopTiming(0.01, 9.0, hello_timeout_s=60.0, discovery_interval_s=1.0)

    def __init__(self) -> None:
        self.hellos = 0

    def hello(self, node_id: int) -> bytes:
        self.hellos += 1
        return b"hello %d" % self.hellos

    def identify(self, node_id: int, participant_id: str, proof: bytes) -> bool:
        return False


def test_a_refused_node_is_asked_again_at_once_then_after_the_hello_timeout(monkeypatch) -> None:
    """The second hello carries hacfed's notice (e.g. that the lab is not registered): it must go out
    at the next discovery, not after hello_timeout_s (issue 43: the lab learned it only 53-83 s later)."""
    import hacfed.server.serverapp as serverapp

    grid, driver = HelloGrid(), RefusingDriver()
    monkeypatch.setattr(serverapp.time, "monotonic", lambda: grid.clock)
    loop = RoundLoop(grid, driver, driver.timing)
    for step in range(200):  # 100 s of the loop's clock, a discovery every 0.5 s
        grid.clock = step * 0.5
        loop.discover()
    sent_at = [at for at, _ in grid.hellos]
    assert sent_at[:2] == [0.0, 1.0], sent_at  # refused at 0.5 s (the reply's pull): asked again at 1.0 s
    assert sent_at[2] >= 1.0 + 60.0, sent_at  # refused again: the next hello waits hello_timeout_s
