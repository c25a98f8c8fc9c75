"""Operator commands given absurd input answer in one line, never a traceback, and never read more
than an enrolment can be: a round number past SQLite's integers, a device, a FIFO, a 200 MiB file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hacfed.clients.enrol import ensure_lab_keys
from hacfed.enrolment import ENROLMENT_FILE, MAX_ENROLMENT_BYTES
from hacfed.server.admin import MAX_ROUND
from hacfed.server.main import main as server_main
from hacfed.server.registry import load_registry
from tests.unit.test_purge import _run as purge_fixture

REPO = Path(__file__).resolve().parents[2]


def _server(*argv: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "hacfed.server.main", *argv], input=stdin, capture_output=True,
                          timeout=120, cwd=REPO)
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())


def _one_line_error(done: subprocess.CompletedProcess[str], message: str) -> None:
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert message in done.stderr, done.stderr


@pytest.mark.parametrize("value", ["99999999999999999999999", str(MAX_ROUND + 1), "-1", "1e3"])
def test_purge_refuses_a_round_out_of_range_in_one_line(tmp_path: Path, value: str) -> None:
    purge_fixture(tmp_path)
    done = _server("purge", "--state-dir", str(tmp_path), "--participant", "lab-x", "--from-round", value)
    _one_line_error(done, "argument --from-round: must be")


def test_purge_takes_the_largest_round_the_journal_holds(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    purge_fixture(tmp_path)
    assert server_main(["purge", "--state-dir", str(tmp_path), "--participant", "lab-x", "--from-round",
                        str(MAX_ROUND)]) == 0
    assert "withdrew 0 samples" in capsys.readouterr().out


def test_register_refuses_a_device_in_one_line(tmp_path: Path) -> None:
    _one_line_error(_server("register", "--state-dir", str(tmp_path), "/dev/zero"), "/dev/zero is not a regular file")


def test_register_refuses_a_fifo_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "enrolment.txt"
    os.mkfifo(fifo)
    _one_line_error(_server("register", "--state-dir", str(tmp_path / "s"), str(fifo)), "is not a regular file")


def test_register_reads_no_more_than_an_enrolment_can_be(tmp_path: Path) -> None:
    """A 200 MiB file (sparse: it takes no disk) is refused after reading the cap, in little memory."""
    big = tmp_path / "big.txt"
    with open(big, "wb") as fh:
        fh.truncate(200 << 20)
    # VmHWM, not ru_maxrss: Linux keeps ru_maxrss across exec, so a child of a large pytest process
    # would report the parent's peak; VmHWM belongs to the new address space.
    code = ("import re, sys; from hacfed.server.main import main; "
            f"rc = main(['register', '--state-dir', {str(tmp_path / 's')!r}, {str(big)!r}]); "
            "print(re.search(r'VmHWM:\\s+(\\d+) kB', open('/proc/self/status').read()).group(1)); sys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    _one_line_error(done, f"is over {MAX_ENROLMENT_BYTES} bytes")
    assert int(done.stdout.strip()) < 150 * 1024, done.stdout  # KiB: far below the file's 200 MiB


def test_register_from_stdin_is_capped_too(tmp_path: Path) -> None:
    _one_line_error(_server("register", "--state-dir", str(tmp_path), "-", stdin=b"x" * (1 << 20)),
                    "standard input is over")
    line = ensure_lab_keys(tmp_path / "lab-b", "lab-b").line
    done = _server("register", "--state-dir", str(tmp_path / "s"), "-", stdin=(line + "\n").encode())
    assert done.returncode == 0, done.stderr
    assert "lab-b" in load_registry(tmp_path / "s" / "keys").entries
    assert (tmp_path / "lab-b" / ENROLMENT_FILE).stat().st_size < 1024  # what a real one weighs
