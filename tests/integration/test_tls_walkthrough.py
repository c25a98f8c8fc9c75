"""The README's "Running a real federation", run as written, on loopback (issue 9; security.md S1, T5).

The commands are read from the README's walk-through block and run in order, with only these
substitutions: the coordinator listens on 127.0.0.1:0 (the OS picks the port) instead of
0.0.0.0:9092, labs dial 127.0.0.1:<that port> instead of coordinator.example:9092, the repository's
deploy/coordinator.toml gets `--set` overrides for tiny rounds, and "sending" a file (an enrolment
to the operator, coordinator.pub and ca.pem to the labs) is a copy. Besides the README's two labs, a
third lab that never got registered (lab-c) tries to join. lab-b is revoked once round 0 closed.

One run of the whole walk-through (a module fixture), several tests that each check one thing.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SMALL_ROUNDS = ["--set", "rounds=3", "--set", "prompts_per_round=2", "--set", "group_size=2", "--set", "eval_every=0",
                "--set", "round_deadline_s=20", "--set", "min_participants=1", "--set", "max_deadline_extensions=0"]


def readme_walkthrough() -> list[str]:
    """The commands of the first ```bash block under "## Running a real federation"."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Running a real federation"):]
    block = section[section.index("```bash") + len("```bash"): section.index("```", section.index("```bash") + 7)]
    joined = re.sub(r"\\\n\s*", " ", block)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


class Proc:
    def __init__(self, name: str, argv: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.name, self.log = name, cwd / f"{name}.log"
        with open(self.log, "ab") as out:
            self.popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, env=env,
                                          start_new_session=True)

    def text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def wait_for(self, pattern: str, timeout: float = 300.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if match := re.search(pattern, self.text()):
                return match
            if self.popen.poll() is not None:
                raise AssertionError(f"{self.name} exited ({self.popen.returncode}) before /{pattern}/:\n"
                                     f"{self.text()[-4000:]}")
            time.sleep(0.3)
        raise AssertionError(f"{self.name}: no /{pattern}/ within {timeout}s:\n{self.text()[-4000:]}")

    def terminate(self, timeout: float = 60.0) -> int:
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                return self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
        return self.popen.wait()


@dataclass
class Walkthrough:
    root: Path
    outputs: dict[str, subprocess.CompletedProcess[str]] = field(default_factory=dict)
    procs: dict[str, Proc] = field(default_factory=dict)
    server_code: int | None = None
    stop_codes: dict[str, int] = field(default_factory=dict)
    open_round_at_revoke: int = -1
    lab_b_log_at_revoke: int = 0
    leftovers: set[int] = field(default_factory=set)

    def journal(self, query: str) -> list[tuple]:
        path = self.root / "state" / "coordinator" / "journal.sqlite"
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            return db.execute(query).fetchall()


def _argv(command: str, port: int | None) -> list[str]:
    argv = shlex.split(command)
    argv[0] = str(BIN / argv[0])
    if port is not None:
        argv = [a.replace("coordinator.example:9092", f"127.0.0.1:{port}") for a in argv]
    if "--listen" in argv:
        argv[argv.index("--listen") + 1] = "127.0.0.1:0"
        argv[argv.index("--config") + 1] = str(REPO / "deploy" / "coordinator.toml")
        argv += SMALL_ROUNDS
    return argv


def _descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE}


@pytest.fixture(scope="module")
def walkthrough(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Walkthrough]:
    root = tmp_path_factory.mktemp("walkthrough")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.setdefault("HACFED_HOME", str(REPO / ".hacfed-home"))
    run = Walkthrough(root)
    before = _descendants()
    commands = readme_walkthrough()
    assert [c.split()[:2] for c in commands] == [
        ["hacfed-server", "certs"], ["hacfed-client", "keys"], ["hacfed-client", "keys"],
        ["hacfed-server", "register"], ["hacfed-server", "register"], ["hacfed-server", "--config"],
        ["hacfed-client", "--model"], ["hacfed-client", "--model"], ["hacfed-server", "revoke"]], commands
    port: int | None = None
    try:
        for i, command in enumerate(commands):
            words = command.split()
            if words[1] == "register":  # the lab sent its enrolment; the operator saved it
                lab = words[-1].removesuffix("-enrolment.txt")
                shutil.copy(root / "state" / lab / "enrolment.txt", root / words[-1])
            if words[1] == "--config":
                server = run.procs["server"] = Proc("server", _argv(command, None), root, env)
                port = int(server.wait_for(r"ready: Fleet API on 127\.0\.0\.1:(\d+)").group(1))
                server.wait_for(r"coordinator public key: (\S+)")
                shutil.copy(root / "state" / "coordinator" / "coordinator.pub", root / "coordinator.pub")
                shutil.copy(root / "certs" / "ca.pem", root / "ca.pem")
            elif words[1] == "--model":
                lab = words[words.index("--participant-id") + 1]
                run.procs[lab] = Proc(lab, _argv(command, port), root, env)
                if lab == "lab-b":  # not in the README: a lab that was never registered tries to join
                    subprocess.run(_argv("hacfed-client keys --state-dir state/lab-c --participant-id lab-c", None),
                                   cwd=root, env=env, check=True, capture_output=True)
                    run.procs["lab-c"] = Proc("lab-c", _argv(command.replace("lab-b", "lab-c"), port), root, env)
            elif words[1] == "revoke":
                run.procs["server"].wait_for(r"round 0 closed", timeout=600)
                run.outputs[f"{i}"] = subprocess.run(_argv(command, port), cwd=root, env=env, capture_output=True,
                                                     text=True, timeout=120)
                run.open_round_at_revoke = run.journal("SELECT MAX(round_id) FROM rounds")[0][0]
                run.lab_b_log_at_revoke = len(run.procs["lab-b"].text())
            else:
                run.outputs[f"{i}"] = subprocess.run(_argv(command, port), cwd=root, env=env, capture_output=True,
                                                     text=True, timeout=120)
                assert run.outputs[f"{i}"].returncode == 0, run.outputs[f"{i}"]
        run.server_code = run.procs["server"].popen.wait(timeout=600)
        for name in ("lab-a", "lab-b", "lab-c"):  # step "Stop any process with Ctrl-C (or SIGTERM)"
            run.stop_codes[name] = run.procs[name].terminate()
        yield run
    finally:
        for proc in run.procs.values():
            proc.terminate()
        run.leftovers = _descendants() - before


@pytest.mark.slow
def test_the_readme_walkthrough_runs_a_tls_federation_to_the_end(walkthrough: Walkthrough) -> None:
    server = walkthrough.procs["server"].text()
    assert walkthrough.server_code == 0, server[-4000:]
    assert "(TLS, SuperNode authentication)" in server
    assert re.search(r"registered the SuperNode key of lab-a with the SuperLink \(node \d+\)", server)
    assert "joined: lab-a" in server and "joined: lab-b" in server
    assert "federation finished: 3 rounds" in server
    assert walkthrough.journal("SELECT COUNT(*) FROM rounds WHERE state != 'OPEN'")[0][0] == 3
    by_round = walkthrough.journal("SELECT round_id, participant_id, COUNT(*) FROM trajectories "
                                   "GROUP BY round_id, participant_id")
    assert (0, "lab-a", 4) in by_round and (0, "lab-b", 4) in by_round  # both labs took part before the revoke
    assert {r for r, pid, _ in by_round if pid == "lab-a"} == {0, 1, 2}


@pytest.mark.slow
def test_a_lab_revoked_mid_run_submits_nothing_more_and_gets_no_more_pools(walkthrough: Walkthrough) -> None:
    revoke_output = next(o for o in walkthrough.outputs.values() if "revoke" in o.args)
    assert revoke_output.returncode == 0 and "revoked lab-b" in revoke_output.stdout
    server = walkthrough.procs["server"].text()
    assert re.search(r"unregistered the SuperNode of lab-b \(node \d+\): revoked", server), server[-3000:]
    assert "revoked: lab-b is no longer registered" in server
    opened = walkthrough.open_round_at_revoke
    later = walkthrough.journal(f"SELECT COUNT(*) FROM trajectories WHERE participant_id = 'lab-b' AND round_id > {opened}")
    assert later == [(0,)]
    after_revoke = walkthrough.procs["lab-b"].text()[walkthrough.lab_b_log_at_revoke:]
    later_rounds = [int(r) for r in re.findall(r"hacfed-client: round (\d+): ", after_revoke)]
    assert all(r <= opened for r in later_rounds), after_revoke  # nothing sent after the revocation
    assert "final update" not in after_revoke
    # lab-b's own console says it was cut off, and its next try to connect is refused
    assert "the coordinator no longer accepts this lab's SuperNode" in after_revoke, after_revoke[-3000:]
    assert "the coordinator refused this lab's SuperNode key" in after_revoke


@pytest.mark.slow
def test_a_lab_that_was_never_registered_never_joins(walkthrough: Walkthrough) -> None:
    assert "joined: lab-c" not in walkthrough.procs["server"].text()
    lab_c = walkthrough.procs["lab-c"].text()
    assert "the coordinator refused this lab's SuperNode key: it is not registered (or was revoked)" in lab_c
    assert walkthrough.journal("SELECT COUNT(*) FROM participants WHERE participant_id = 'lab-c'") == [(0,)]


@pytest.mark.slow
def test_every_process_of_the_walkthrough_stops_cleanly(walkthrough: Walkthrough) -> None:
    assert walkthrough.stop_codes == {"lab-a": 0, "lab-b": 0, "lab-c": 0}, {
        name: walkthrough.procs[name].text()[-1500:] for name in walkthrough.stop_codes}
    assert walkthrough.leftovers == set()
