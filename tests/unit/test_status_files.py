"""The state files a restart reads survive a kill -9 mid-write: the coordinator's status
(server/run_end.py `write_status`, server/runner.py `rounds_progress`), its remembered Fleet port
(server/runner.py `start_link_on_known_port`, `remembered_port`) and each CLI's children list
(hacfed/leftovers.py `record_children`, `kill_leftovers`).

CI once saw a restarted hacfed-server stop at once with `error: Expecting value: line 1 column 1`: the
kill -9 of the fault test had come while the ServerApp rewrote `driver-status.json` in place, and the
new hacfed-server read the empty file. The files are now replaced whole (`write_atomic`), and a torn one
left by an older version says "no progress known", "no port remembered" or "no children known" instead of
stopping the server or the lab.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

import hacfed.envelope
from hacfed.leftovers import CHILDREN_FILE, kill_leftovers, record_children
from hacfed.server.driver_settings import STATUS_FILE
from hacfed.server.run_end import write_status
from hacfed.server.runner import PORT_FILE, remembered_port, rounds_progress, start_link_on_known_port


def _coordinator(next_round: int, open_rounds: list[int]) -> SimpleNamespace:
    return SimpleNamespace(next_round_id=next_round, current_round=open_rounds[-1] if open_rounds else None,
                           open_rounds=lambda: list(open_rounds))


def test_a_status_write_that_dies_before_its_rename_leaves_the_previous_status_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_status(tmp_path, _coordinator(2, [1]), done=False)
    before = (tmp_path / STATUS_FILE).read_text(encoding="utf-8")

    def killed(*args: object) -> None:  # the process dies between writing the new text and the rename
        raise OSError("killed")

    monkeypatch.setattr(hacfed.envelope.os, "replace", killed)
    with pytest.raises(OSError, match="killed"):
        write_status(tmp_path, _coordinator(3, [2]), done=False)
    assert (tmp_path / STATUS_FILE).read_text(encoding="utf-8") == before
    assert json.loads(before)["next_round"] == 2
    assert [p.name for p in tmp_path.iterdir()] == [STATUS_FILE]  # no temporary file left behind
    assert rounds_progress(tmp_path) == (2, 1, (1,))


@pytest.mark.parametrize("text", ["", "{\"next_round\": 3, \"open", "[]", "{\"open_round\": 1}"])
def test_a_torn_or_foreign_status_file_says_no_progress_instead_of_stopping_the_server(tmp_path: Path,
                                                                                       text: str) -> None:
    (tmp_path / STATUS_FILE).write_text(text, encoding="utf-8")
    assert rounds_progress(tmp_path) == (-1, None, ())
    assert rounds_progress(tmp_path / "missing") == (-1, None, ())


class _Link:
    def __init__(self, port: int) -> None:
        self.fleet_port = port


class _Server:
    """What `start_link_on_known_port` asks of a Server: its state dir and a SuperLink on a port."""

    def __init__(self, state: Path, free: int) -> None:
        self.state, self.free, self.asked = state, free, []

    def start_link(self, port: int) -> _Link:
        self.asked.append(port)
        return _Link(port or self.free)


def test_the_remembered_port_is_written_whole_and_a_dying_write_keeps_the_old_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = _Server(tmp_path, free=41000)
    assert start_link_on_known_port(server, 0).fleet_port == 41000
    assert (tmp_path / PORT_FILE).read_text(encoding="utf-8") == "41000\n"
    monkeypatch.setattr(hacfed.envelope.os, "replace", lambda *a: (_ for _ in ()).throw(OSError("killed")))
    with pytest.raises(OSError, match="killed"):
        start_link_on_known_port(_Server(tmp_path, free=42000), 9093)
    assert (tmp_path / PORT_FILE).read_text(encoding="utf-8") == "41000\n"
    assert [p.name for p in tmp_path.iterdir()] == [PORT_FILE]


@pytest.mark.parametrize("text", ["", "41", "\x00\x00", "99999", "-5", "port"])
def test_a_torn_port_file_lets_the_os_pick_instead_of_stopping_the_server(tmp_path: Path, text: str,
                                                                          capsys: pytest.CaptureFixture) -> None:
    (tmp_path / PORT_FILE).write_text(text, encoding="utf-8")
    expected = 41 if text == "41" else None
    assert remembered_port(tmp_path / PORT_FILE) == expected
    server = _Server(tmp_path, free=43000)
    start_link_on_known_port(server, 0)
    assert server.asked == ([41] if expected else [0])
    if expected is None:
        assert "letting the OS pick" in capsys.readouterr().out
    assert (tmp_path / PORT_FILE).read_text(encoding="utf-8") == f"{41 if expected else 43000}\n"


def test_a_children_write_that_dies_before_its_rename_keeps_the_previous_list(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record_children(tmp_path, [("superlink", 1)])
    before = (tmp_path / CHILDREN_FILE).read_text(encoding="utf-8")
    monkeypatch.setattr(hacfed.envelope.os, "replace", lambda *a: (_ for _ in ()).throw(OSError("killed")))
    with pytest.raises(OSError, match="killed"):
        record_children(tmp_path, [("superlink", 1), ("supernode", 2)])
    assert (tmp_path / CHILDREN_FILE).read_text(encoding="utf-8") == before
    assert [p.name for p in tmp_path.iterdir()] == [CHILDREN_FILE]


@pytest.mark.parametrize("text", ["", "[{\"name\": \"superlink\", \"pid\"", "{}", "[{\"pid\": 1}]",
                                  "[{\"name\": \"x\", \"pid\": 0, \"start_ticks\": 5}]",
                                  "[{\"name\": \"x\", \"pid\": \"1\", \"start_ticks\": 5}]"])
def test_a_torn_children_file_names_no_child_and_does_not_stop_the_next_start(
        tmp_path: Path, text: str, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / CHILDREN_FILE).write_text(text, encoding="utf-8")
    assert kill_leftovers(tmp_path, grace_s=0.1, timeout_s=0.1) == []
    assert "unreadable" in capsys.readouterr().err
    assert not (tmp_path / CHILDREN_FILE).exists()
