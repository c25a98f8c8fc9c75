"""The coordinator keeps free-space headroom in its state dir (issue 31; security.md R5, docs/operating.md).

hacfed-server refuses to start below `server.min_free_mib` with one line naming the directory, the
free bytes and the setting; a running coordinator pauses (opens, closes and sends nothing) and goes
on by itself once space is back. The free space is injected (`shutil.disk_usage`); the real file
system check runs in tests/integration/test_state_dir_headroom.py.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hacfed.server.config import ServerSettings
from hacfed.server.headroom import CHECK_INTERVAL_S, MIB, DiskUsage, check_headroom, shortfall
from hacfed.server.main import main as server_main
from tests.unit.test_coordinator_fakes import FakeClock
from tests.unit.test_refused_before_files import server_config  # noqa: F401 - a fixture
from tests.unit.test_server_driver import Federation


class FakeDisk:
    """shutil.disk_usage with a free space the test sets."""

    def __init__(self, free: int) -> None:
        self.free = free
        self.asked: list[Path] = []

    def __call__(self, path: Path) -> DiskUsage:
        self.asked.append(Path(path))
        return DiskUsage(10 * 1024 * MIB, 10 * 1024 * MIB - self.free, self.free)


def test_the_line_names_the_directory_the_free_bytes_and_the_setting(tmp_path: Path) -> None:
    disk = FakeDisk(3 * MIB)
    problem = shortfall(tmp_path / "not" / "yet", 512, disk)
    assert problem is not None and str(tmp_path / "not" / "yet") in problem
    assert f"{3 * MIB} bytes free" in problem and "server.min_free_mib = 512" in problem
    assert disk.asked == [tmp_path]  # a state dir not made yet: the file system it will be made on
    assert shortfall(tmp_path, 3, disk) is None
    assert shortfall(tmp_path, 0, FakeDisk(0)) is None  # 0 turns the check off
    with pytest.raises(ValueError, match="lower server.min_free_mib"):
        check_headroom(tmp_path, 4, disk)


def test_the_setting_is_validated_and_defaults_to_512_mib() -> None:
    assert ServerSettings(insecure=True).min_free_mib == 512
    for bad in (-1, 1.5, True, "512"):
        with pytest.raises(ValueError, match="server.min_free_mib must be an integer >= 0"):
            ServerSettings(insecure=True, min_free_mib=bad)


def _started(state: Path) -> None:
    raise AssertionError(f"hacfed-server went on to lock {state}")


def test_hacfed_server_refuses_to_start_without_headroom(server_config: Path,  # noqa: F811
                                                         capsys: pytest.CaptureFixture,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "disk_usage", FakeDisk(100 * MIB))
    monkeypatch.setattr("hacfed.server.runner.lock_state_dir", _started)  # never a real server, even if broken
    assert server_main(["--config", str(server_config), "--set", "server.min_free_mib=200"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hacfed-server: error: the state dir ") and f"{100 * MIB} bytes free" in err
    assert "server.min_free_mib = 200" in err and len(err.strip().splitlines()) == 1, err
    assert not (server_config.parent / "state").exists()  # refused before anything was created


def test_a_running_coordinator_pauses_without_headroom_and_resumes_when_space_returns(tmp_path: Path) -> None:
    clock = FakeClock()
    fed = Federation(tmp_path, clock, expected_participants=1)
    disk = FakeDisk(10 * MIB)
    fed.driver.headroom._usage = disk
    fed.add(1, "lab-a")
    for _ in range(3):  # paused: no round opens, nothing is sent, however often the loop asks
        assert fed.exchange() == {}
        clock.t += CHECK_INTERVAL_S
    assert fed.driver.coordinator.current_round is None and fed.driver.coordinator.next_round_id == 0
    paused = [line for line in fed.lines if line.startswith("PAUSED: ")]
    assert len(paused) == 1 and "server.min_free_mib = 512" in paused[0] and f"{10 * MIB} bytes free" in paused[0]
    disk.free = 600 * MIB  # the operator freed space: the same process carries on
    fed.run()
    assert any(line.startswith("resumed: the state dir") for line in fed.lines)
    assert fed.driver.coordinator.finished and [r["round"] for r in fed.rows() if "round" in r][:2] == [0, 1]


def test_a_round_open_when_space_runs_out_is_not_closed_until_space_returns(tmp_path: Path) -> None:
    clock = FakeClock()
    fed = Federation(tmp_path, clock, expected_participants=1)
    disk = FakeDisk(600 * MIB)
    fed.driver.headroom._usage = disk
    fed.add(1, "lab-a")
    assert fed.driver.next_round(fed.identified())  # round 0 opened and sent; its reply never comes
    disk.free = MIB
    for _ in range(10):  # far past the deadline and its extensions
        clock.t += fed.config.coordinator.round_deadline_s * 10
        fed.driver.close_round()
    assert fed.driver.coordinator.current_round == 0  # not closed (nothing written) while paused
    assert not fed.config.metrics_out.exists()
    disk.free = 600 * MIB
    for _ in range(10):  # below quorum: the deadline is extended (journaled) before the round closes
        clock.t += fed.config.coordinator.round_deadline_s * 10
        fed.driver.close_round()
    assert fed.driver.coordinator.current_round is None and fed.rows()[0]["round"] == 0


def test_the_deadline_of_a_round_open_during_a_pause_moves_later_by_the_time_paused(tmp_path: Path) -> None:
    clock = FakeClock()
    fed = Federation(tmp_path, clock, expected_participants=1)
    disk = FakeDisk(600 * MIB)
    fed.driver.headroom._usage = disk
    fed.add(1, "lab-a")
    assert fed.driver.next_round(fed.identified())  # round 0 opened and sent
    coordinator, deadline_s = fed.driver.coordinator, fed.config.coordinator.round_deadline_s
    deadline = coordinator.round_record(0).deadline
    disk.free = MIB
    clock.t += CHECK_INTERVAL_S
    fed.driver.close_round()  # PAUSED
    paused_at = clock.t
    clock.t += 3 * deadline_s  # the labs could not deliver meanwhile
    disk.free = 600 * MIB
    fed.driver.close_round()  # resumed: the deadline is held, the round stays open
    held = clock.t - paused_at
    assert coordinator.round_record(0).deadline == pytest.approx(deadline + held)
    assert coordinator.round_record(0).extensions == 0 and coordinator.current_round == 0
    assert f"round 0: deadline held {held:.0f}s (the time paused)" in fed.lines
    assert fed.driver.journal.events("deadline_held")[0]["round_id"] == 0


def test_a_write_failing_for_lack_of_space_pauses_too_with_the_setting_off(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    fed = Federation(tmp_path, clock, expected_participants=1)
    fed.driver.headroom.min_free_mib = 0  # the free-space check is off; another writer filled the disk
    full = "a write of 256 KiB to the state dir s fails: No space left on device"
    probe = {"problem": full}
    monkeypatch.setattr("hacfed.server.headroom.probe_space", lambda state_dir: probe["problem"])
    fed.add(1, "lab-a")
    for _ in range(3):
        assert fed.exchange() == {}
        clock.t += CHECK_INTERVAL_S
    assert fed.driver.coordinator.next_round_id == 0
    assert [line for line in fed.lines if line.startswith("PAUSED: ")] == [
        f"PAUSED: {full}; no round is opened or closed and nothing is sent until space returns (checked every 5s)"]
    probe["problem"] = None
    fed.run()
    assert any(line.startswith("resumed: the state dir") for line in fed.lines)
    assert fed.driver.coordinator.finished


def test_no_deadline_is_extended_and_no_exchange_ended_by_one_while_paused(tmp_path: Path) -> None:
    clock = FakeClock()
    fed = Federation(tmp_path, clock, expected_participants=1)
    disk = FakeDisk(600 * MIB)
    fed.driver.headroom._usage = disk
    fed.add(1, "lab-a")
    assert fed.driver.next_round(fed.identified())  # round 0 opened and sent; its reply never comes
    disk.free = MIB
    clock.t += CHECK_INTERVAL_S
    fed.driver.close_round()  # PAUSED
    clock.t += 10 * fed.config.coordinator.round_deadline_s
    fed.driver.close_round()  # an extension would be a journal write on a full disk: none while paused
    assert fed.driver.coordinator.round_record(0).extensions == 0
    assert fed.driver.journal.events("deadline_extended") == []
