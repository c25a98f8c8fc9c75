"""The README's "Running a real federation" walk-through, run exactly as written (issue 9; security.md S1, T5).

The commands are read from the README section's bash blocks and run in order in a fresh directory
laid out like the clone (deploy/coordinator.toml copied in), with only these substitutions:
- each command's first word (hacfed-server, hacfed-client) is this venv's script: the environment the
  README asks to activate;
- port 9092 becomes a port that is free now (the README's choice; another test may hold 9092);
- the run's `rounds=200` becomes `rounds=30`: the README's many rounds leave a person the time to
  run step 6 by hand (`test_the_walkthrough_run_leaves_time_for_step_6`); the test runs it at once,
  and 30 rounds keep the coordinator up until the revoked lab's next try to connect was refused.
The long-running commands (hacfed-server --config, hacfed-client --model) start in the background,
as in their own terminals; the revocation (step 6) runs once round 0 closed, while the federation
runs; lab-b, which the README says to stop with Ctrl-C once revoked, gets SIGINT. Besides the README's
commands, a lab that was never registered (lab-c) tries to join, and lab-a's command is run again
after the run ended (it must say in one line that it already finished).

One run of the whole walk-through (a module fixture), several tests that each check one thing.
Every process started is stopped by its pid (or its process group's id), also when a step fails.
"""

from __future__ import annotations

import re
import shlex
import shutil
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hacfed.procs import free_port
from tests.processes import BIN, REPO, Proc, cli_env, running_descendants

README_PORT = "9092"
README_ROUNDS, TEST_ROUNDS = "rounds=200", "rounds=30"
MIN_README_ROUNDS = 100  # about a second each with the tiny models: minutes, time to type step 6
LONG_RUNNING = (("hacfed-server", "--config"), ("hacfed-client", "--model"))


def readme_walkthrough() -> list[str]:
    """The commands of the bash blocks under "## Running a real federation", continuation lines joined."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    start = text.index("## Running a real federation")
    section = text[start: text.find("\n## ", start + 3)]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    assert blocks, "no bash block in the README's walk-through"
    joined = re.sub(r"\\\n\s*", " ", "\n".join(blocks))
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def as_run(command: str, port: int) -> list[str]:
    """The command's words, with the two substitutions of the module docstring."""
    argv = [word.replace(f":{README_PORT}", f":{port}") for word in shlex.split(command)]
    argv = [TEST_ROUNDS if word == README_ROUNDS else word for word in argv]
    assert argv[0] in ("hacfed-server", "hacfed-client"), command
    return [str(BIN / argv[0]), *argv[1:]]


def start(name: str, argv: list[str], root: Path, env: dict[str, str]) -> Proc:
    """A long-running command, as in its own terminal: in `root`, its output in `root/NAME.log`."""
    return Proc(name, argv, root / f"{name}.log", env)


def stop(proc: Proc, sig: signal.Signals = signal.SIGTERM) -> int:
    """`sig` to the process alone (SIGINT: Ctrl-C), its whole group killed if it outlives 120 s."""
    return proc.stop(sig, timeout=120.0, group=False)


@dataclass
class Walkthrough:
    root: Path
    commands: list[str]
    outputs: dict[str, subprocess.CompletedProcess[str]] = field(default_factory=dict)
    procs: dict[str, Proc] = field(default_factory=dict)
    server_code: int | None = None
    lab_a_code: int | None = None
    rerun: subprocess.CompletedProcess[str] | None = None
    stop_codes: dict[str, int] = field(default_factory=dict)
    open_round_at_revoke: int = -1
    lab_b_log_at_revoke: int = 0
    revoke_s: float = -1.0  # from the revoke command's return to the SuperLink unregistering lab-b
    leftovers: set[int] = field(default_factory=set)

    def journal(self, query: str) -> list[tuple]:
        path = self.root / "state" / "tls" / "coordinator" / "journal.sqlite"
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            return db.execute(query).fetchall()


def _run(argv: list[str], root: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=300)


def _play(run: Walkthrough, env: dict[str, str], port: int) -> None:
    """Every README command in order (see the module docstring for what happens around them)."""
    root = run.root
    for i, command in enumerate(run.commands):
        words = shlex.split(command)
        if tuple(words[:2]) in LONG_RUNNING:
            name = "server" if words[0] == "hacfed-server" else words[words.index("--participant-id") + 1]
            run.procs[name] = start(name, as_run(command, port), root, env)
            if name == "server":
                run.procs[name].wait_for(rf"ready: Fleet API on 127\.0\.0\.1:{port} ", timeout=600)
            if name == "lab-b":  # not in the README: a lab that was never registered tries to join
                keys = _run(as_run("hacfed-client keys --state-dir state/tls/lab-c --participant-id lab-c", port),
                            root, env)
                assert keys.returncode == 0, keys
                run.procs["lab-c"] = start("lab-c", as_run(command.replace("lab-b", "lab-c"), port), root, env)
            continue
        if words[1] == "revoke":  # "while the federation runs"
            run.procs["server"].wait_for(r"round 0 closed", timeout=900)
            run.lab_b_log_at_revoke = len(run.procs["lab-b"].text())
        run.outputs[str(i)] = done = _run(as_run(command, port), root, env)
        assert done.returncode == 0, (command, done.stdout, done.stderr)
        if words[1] == "revoke":
            run.open_round_at_revoke = run.journal("SELECT MAX(round_id) FROM rounds")[0][0]
            returned = time.monotonic()
            run.procs["server"].wait_for(r"unregistered the SuperNode of lab-b", timeout=120)
            run.revoke_s = time.monotonic() - returned
            print(f"revocation: lab-b's SuperNode unregistered {run.revoke_s:.1f} s after the revoke command returned")
            # while the federation still runs, lab-b's next try to connect is refused (what its console says)
            run.procs["lab-b"].wait_for(r"the coordinator refused this lab's SuperNode key", timeout=300)


@pytest.fixture(scope="module")
def walkthrough(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Walkthrough]:
    root = tmp_path_factory.mktemp("walkthrough")
    (root / "deploy").mkdir()
    shutil.copy(REPO / "deploy" / "coordinator.toml", root / "deploy" / "coordinator.toml")
    env = {**cli_env(), "OMP_NUM_THREADS": "1"}
    commands = readme_walkthrough()
    assert [shlex.split(c)[:2] for c in commands] == [
        ["hacfed-server", "certs"], ["hacfed-client", "keys"], ["hacfed-client", "keys"],
        ["hacfed-server", "register"], ["hacfed-server", "register"], ["hacfed-server", "--config"],
        ["hacfed-client", "--model"], ["hacfed-client", "--model"], ["hacfed-server", "revoke"]], commands
    run = Walkthrough(root, commands)
    before = running_descendants()
    try:
        _play(run, env, free_port())
        run.server_code = run.procs["server"].popen.wait(timeout=1800)
        run.lab_a_code = run.procs["lab-a"].popen.wait(timeout=300)  # exits by itself once the run is closed
        lab_a_command = next(c for c in commands if "--participant-id lab-a" in c and "--model" in c)
        run.rerun = _run(as_run(lab_a_command, free_port()), root, env)
        for name in ("lab-b", "lab-c"):  # the README: stop the refused lab with Ctrl-C
            run.stop_codes[name] = stop(run.procs[name], signal.SIGINT)
        yield run
    finally:
        for proc in run.procs.values():
            stop(proc)
        run.leftovers = running_descendants() - before


@pytest.mark.slow
def test_the_readme_walkthrough_runs_a_tls_federation_to_the_end(walkthrough: Walkthrough) -> None:
    server = walkthrough.procs["server"].text()
    assert walkthrough.server_code == 0, server[-4000:]
    assert "(TLS, SuperNode authentication)" in server
    assert "state/tls/coordinator/coordinator.pub" in server  # where step 5 says the key is
    assert re.search(r"registered the SuperNode key of lab-a with the SuperLink \(node \d+\)", server)
    assert "joined: lab-a" in server and "joined: lab-b" in server
    assert "federation finished: 30 rounds" in server
    assert walkthrough.journal("SELECT COUNT(*) FROM rounds WHERE state != 'OPEN'")[0][0] == 30
    by_round = walkthrough.journal("SELECT round_id, participant_id, COUNT(*) FROM trajectories "
                                   "GROUP BY round_id, participant_id")
    assert (0, "lab-a", 16) in by_round and (0, "lab-b", 16) in by_round  # both took part (4 prompts x G=4)
    assert {r for r, pid, _ in by_round if pid == "lab-a"} == set(range(30))
    assert walkthrough.lab_a_code == 0, walkthrough.procs["lab-a"].text()[-3000:]


@pytest.mark.slow
def test_a_lab_revoked_mid_run_submits_nothing_more_and_is_not_waited_for(walkthrough: Walkthrough) -> None:
    revoke_output = next(o for o in walkthrough.outputs.values() if "revoke" in o.args)
    assert "revoked lab-b" in revoke_output.stdout
    server = walkthrough.procs["server"].text()
    assert re.search(r"unregistered the SuperNode of lab-b \(node \d+\): revoked", server), server[-3000:]
    assert "revoked: lab-b is no longer registered" in server
    opened = walkthrough.open_round_at_revoke
    later = walkthrough.journal("SELECT COUNT(*) FROM trajectories "
                                f"WHERE participant_id = 'lab-b' AND round_id > {opened}")
    assert later == [(0,)]
    # rounds after the revocation close at quorum with lab-a alone, not at their 600 s deadline
    reasons = walkthrough.journal(f"SELECT round_id, close_reason FROM rounds WHERE round_id > {opened}")
    assert reasons and all(reason == "quorum" for _, reason in reasons), reasons
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
def test_a_lab_started_again_after_its_run_says_so_in_one_line(walkthrough: Walkthrough) -> None:
    rerun = walkthrough.rerun
    assert rerun is not None and rerun.returncode == 0 and rerun.stderr == "", rerun
    assert rerun.stdout.count("\n") == 1 and "this lab already finished run federation-1" in rerun.stdout, rerun.stdout


@pytest.mark.slow
def test_every_process_of_the_walkthrough_stops_cleanly(walkthrough: Walkthrough) -> None:
    assert walkthrough.stop_codes == {"lab-b": 0, "lab-c": 0}, {
        name: walkthrough.procs[name].text()[-1500:] for name in walkthrough.stop_codes}
    assert walkthrough.leftovers == set()


def test_the_walkthrough_run_leaves_time_for_step_6() -> None:
    """A person runs step 6 by hand while the federation runs: the run must not end seconds after the
    labs joined (10 rounds end about 10 s after they join)."""
    server = next(c for c in readme_walkthrough() if c.startswith("hacfed-server --config"))
    rounds = [int(word.split("=")[1]) for word in shlex.split(server) if word.startswith("rounds=")]
    assert rounds and rounds[0] >= MIN_README_ROUNDS, server
    assert f"--set {README_ROUNDS}" in server and TEST_ROUNDS in as_run(server, 1)  # what the slow tests run


def test_the_walkthrough_leaves_nothing_git_would_add() -> None:
    """certs/ (with ca.key) and state/ are ignored, so following the README in the clone adds no file."""
    ignored = subprocess.run(["git", "check-ignore", "certs/ca.key", "state/tls/lab-a/participant.key"], cwd=REPO,
                             capture_output=True, text=True)
    assert ignored.stdout.split() == ["certs/ca.key", "state/tls/lab-a/participant.key"], ignored
