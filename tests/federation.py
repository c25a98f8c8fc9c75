"""The tests' real federation on loopback, and the coordinator configs they run.

    fed = Federation(tmp_path)
    fed.configure(coordinator_toml("it-x", rounds=2, expected_participants=2, min_participants=2))
    fed.start(("lab-a", "lab-b"))        # hacfed-server on a free port, two hacfed-client labs
    ...
    fed.teardown(before)                 # or fed.stop_all()

One hacfed-server (`--insecure`, on `listen` or the federation's address, the same after every
restart) and hacfed-client labs, each a `Proc` (tests/processes.py: own session, output in a log file,
ended by pid). The test is the coordinator's operator: `start` creates the coordinator's key before the
server starts, and each lab's `participant.pub` is copied into the server's keys dir as soon as the
lab wrote it. The readers (`rows`, `outbox`, `receipts`, ...) open the coordinator's journal and the
labs' outboxes read-only beside the running processes; `kill_tree` and `teardown` keep track of every
process of every tree they saw, so that what a killed process started is checked too.
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import psutil

from hacfed.clients.outbox import decode_key
from hacfed.envelope import key_id, load_public_key
from hacfed.exchange import open_answer
from hacfed.keys import ensure_key_pair
from hacfed.procs import free_port
from hacfed.wire import SubmissionReceipt
from tests.processes import BIN, REPO, Proc, cli_env, running_descendants, still_running

MODEL = "tiny-llama"  # the labs' default preset
LYING_LAB = REPO / "tests" / "lying_lab.py"  # hacfed-client claiming the opposite of every reward
TRACE = re.compile(r"Traceback \(most recent call last\)")
ARITHMETIC = {"kind": "arithmetic", "digits": 2, "operators": "+"}

TomlValue = str | int | float | bool | list[str]


def _toml_value(value: TomlValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return repr(value)


def _toml_table(name: str, table: Mapping[str, object]) -> list[str]:
    """`[name]` with its keys, then its sub-tables (`[name.sub]`)."""
    lines = [f"[{name}]"] if name else []
    lines += [f"{key} = {_toml_value(value)}" for key, value in table.items() if not isinstance(value, Mapping)]
    for key, value in table.items():
        if isinstance(value, Mapping):
            lines += _toml_table(f"{name}.{key}" if name else key, value)
    return lines


def coordinator_toml(run_id: str, *, rounds: int, expected_participants: int, min_participants: int,
                     round_deadline_s: float = 120, prompts_per_round: int = 2, group_size: int = 2,
                     task: Mapping[str, object] | None = None, max_new_tokens: int | None = 6,
                     server: Mapping[str, object] | None = None, **settings: TomlValue) -> str:
    """The text of a coordinator's --config: tiny rounds of 2-digit additions (2 prompts x G = 2, 6 new
    tokens) kept in `server/` beside the config; `settings` are more top-level keys (eval_every,
    max_strikes, max_staleness, ...), `task` replaces the [task] table, `max_new_tokens=None` leaves
    [sampling] out, `server` is a [server] table."""
    top = {"run_id": run_id, "rounds": rounds, "prompts_per_round": prompts_per_round, "group_size": group_size,
           "expected_participants": expected_participants, "min_participants": min_participants,
           "round_deadline_s": round_deadline_s, "state_dir": "server", **settings}
    tables: dict[str, Mapping[str, object]] = {"task": task or ARITHMETIC}
    if max_new_tokens is not None:
        tables["sampling"] = {"max_new_tokens": max_new_tokens}
    if server:
        tables["server"] = server
    return "\n".join(_toml_table("", {**top, **tables})) + "\n"


def lab_outbox(state_dir: Path) -> Path:
    return state_dir / "service" / "outbox.sqlite"


@contextmanager
def read_only(path: Path) -> Iterator[sqlite3.Connection]:
    """A read-only connection to a SQLite file another process may be writing (WAL), closed after."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30.0)
    try:
        yield db
    finally:
        db.close()


class Federation:
    """hacfed-server and hacfed-client processes in `tmp_path` (module docstring); every one started is
    kept in `procs`, so that `stop_all` or `teardown` ends them whatever happened."""

    def __init__(self, tmp_path: Path, env: dict[str, str] | None = None, metrics_out: Path | None = None) -> None:
        self.tmp = tmp_path
        self.env = env if env is not None else cli_env()
        self.server_dir = tmp_path / "server"
        self.metrics_out = metrics_out  # the servers' --metrics-out (default: in the state dir)
        self.procs: list[Proc] = []
        self.seen: dict[int, float] = {}  # pid -> create time of every process of every tree seen
        self.address: str | None = None  # the Fleet API, once known
        self.labs: dict[str, Proc] = {}

    # -- processes -------------------------------------------------------------------------------

    def configure(self, toml: str) -> None:
        """The coordinator's --config (`coordinator_toml` writes one)."""
        (self.tmp / "coordinator.toml").write_text(toml)

    def start(self, labs: tuple[str, ...], extra_env: dict[str, str] | None = None) -> Proc:
        """hacfed-server and the labs at once: the coordinator's key and port are fixed first (as the
        operator would hand them out), so the labs load their models while the SuperLink starts."""
        ensure_key_pair(self.server_dir, "coordinator")
        (self.server_dir / "keys").mkdir(parents=True, exist_ok=True)
        self.address = f"127.0.0.1:{free_port()}"
        server = self.server("server-1.log", extra_env=extra_env, wait=False)
        for pid in labs:
            self.lab(pid)
        self._ready(server)
        return server

    def server(self, log: str, extra_env: dict[str, str] | None = None, wait: bool = True,
               listen: str | None = None) -> Proc:
        """hacfed-server on `listen` (default: the federation's address, the same after a restart);
        with `wait`, until its Fleet API listens on the federation's address."""
        listen = listen or self.address
        assert listen is not None, "start() the federation first, or name the address"
        argv = [str(BIN / "hacfed-server"), "--config", str(self.tmp / "coordinator.toml"), "--insecure",
                "--listen", listen, "--state-dir", str(self.server_dir),
                *(["--metrics-out", str(self.metrics_out)] if self.metrics_out else [])]
        proc = Proc(log, argv, self.tmp / log, {**self.env, **(extra_env or {})})
        self.procs.append(proc)
        if wait:
            self._ready(proc)
        return proc

    def _ready(self, server: Proc) -> None:
        server.wait_for(rf"hacfed-server: ready: Fleet API on {re.escape(str(self.address))} ", timeout=180)
        self.remember(server)

    def lab(self, pid: str, model: str = MODEL, *, extra: tuple[str, ...] = ("--eval-problems", "4"),
            cheat: bool = False, stay: bool = False, extra_env: dict[str, str] | None = None,
            log: str | None = None) -> Proc:
        """hacfed-client for `pid` (its state dir is kept across restarts: the same keys; `cheat`: the
        lying lab of tests/lying_lab.py); the operator registers its key as soon as it exists."""
        assert self.address is not None, "start() the federation first"
        command = [sys.executable, str(LYING_LAB)] if cheat else [str(BIN / "hacfed-client")]
        argv = [*command, "--model", model, "--server", self.address, "--participant-id", pid,
                "--state-dir", str(self.tmp / pid), "--coordinator-key", str(self.server_dir / "coordinator.pub"),
                "--insecure", *extra, *(["--stay"] if stay else [])]
        proc = Proc(pid, argv, self.tmp / (log or f"{pid}.log"), {**self.env, **(extra_env or {})})
        self.procs.append(proc)
        self.labs[pid] = proc
        key, registered = self.tmp / pid / "participant.pub", self.server_dir / "keys" / f"{pid}.pub"
        deadline = time.monotonic() + 120
        while not key.exists():
            assert time.monotonic() < deadline and proc.popen.poll() is None, proc.text()[-3000:]
            time.sleep(0.1)
        if not registered.exists():
            registered.write_bytes(key.read_bytes())
        return proc

    def remember(self, proc: Proc) -> list[psutil.Process]:
        """The process and its descendants now; each is checked at teardown."""
        try:
            root = psutil.Process(proc.popen.pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []
        for p in tree:
            try:
                self.seen.setdefault(p.pid, p.create_time())
            except psutil.NoSuchProcess:
                pass
        return tree

    def signal_tree(self, proc: Proc, sig: int) -> list[int]:
        """Send `sig` to the process and every descendant, by pid, children first; returns the pids."""
        tree = self.remember(proc)
        for p in reversed(tree):
            try:
                p.send_signal(sig)
            except psutil.NoSuchProcess:
                pass
        return [p.pid for p in tree]

    def kill_tree(self, proc: Proc) -> None:
        """kill -9 the process and everything it started (the whole coordinator, or a whole lab), and
        wait until every one of them is gone: a killed process may run on for a moment after its
        parent has exited (the ServerApp committing the next round's opening), and a test that reads
        the journal right after the kill must see its final state."""
        pids = set(self.signal_tree(proc, signal.SIGKILL))
        assert proc.exit_code(30) == -signal.SIGKILL
        deadline = time.monotonic() + 30
        while alive := still_running(pids):
            assert time.monotonic() < deadline, f"still running 30 s after kill -9: {sorted(alive)}"
            time.sleep(0.05)

    def kill(self, proc: Proc) -> None:
        """kill -9 only this process: its children's guards (hacfed.child_guard) then end them."""
        self.remember(proc)
        os.kill(proc.popen.pid, signal.SIGKILL)
        assert proc.exit_code(30) == -signal.SIGKILL

    def stop_all(self) -> None:
        """Stop every process started, the last first."""
        for proc in reversed(self.procs):
            proc.stop()

    def teardown(self, before: set[int], strict: bool = True) -> None:
        """Stop every process; with `strict` (the test passed), fail naming whatever outlived them."""
        for proc in self.procs:
            if proc.popen.poll() is None:
                self.remember(proc)
        for pid in self._left(before):  # a stopped straggler (all of its tree) must see its SIGTERM
            try:
                psutil.Process(pid).send_signal(signal.SIGCONT)
            except psutil.NoSuchProcess:
                pass
        self.stop_all()
        deadline = time.monotonic() + 30
        while (left := self._left(before)) and time.monotonic() < deadline:
            time.sleep(0.2)
        described = [_describe(pid) for pid in sorted(left)]
        for pid in left:  # nothing outlives the test, but it fails below
            try:
                p = psutil.Process(pid)
                if abs(p.create_time() - self.seen.get(pid, p.create_time())) < 0.01:
                    p.kill()
            except psutil.NoSuchProcess:
                pass
        assert not (strict and left), f"left running: {described}"

    def _left(self, before: set[int]) -> set[int]:
        """What still runs of the trees seen (the same processes, not reused pids), and any other
        descendant of this test process started since `before`."""
        alive = set()
        for pid in still_running(set(self.seen)) | (running_descendants() - before):
            try:
                if pid not in self.seen or abs(psutil.Process(pid).create_time() - self.seen[pid]) < 0.01:
                    alive.add(pid)
            except psutil.NoSuchProcess:
                pass
        return alive

    # -- what the coordinator and the labs hold -------------------------------------------------

    def console(self, proc: Proc, pattern: str, timeout: float = 240.0, since: int = 0) -> re.Match[str]:
        """The first match of `pattern` in the process's output after character `since`."""
        deadline = time.monotonic() + timeout
        while True:
            match = re.compile(pattern).search(proc.text(), since)
            if match:
                return match
            assert proc.popen.poll() is None, f"{proc.name} exited before /{pattern}/:\n{proc.text()[-5000:]}"
            assert time.monotonic() < deadline, f"{proc.name}: no /{pattern}/ within {timeout}s:\n{proc.text()[-5000:]}"
            time.sleep(0.2)

    def rows(self, sql: str, *args: object) -> list[tuple]:
        """What the journal holds now (read-only, beside the running coordinator)."""
        with read_only(self.server_dir / "journal.sqlite") as db:
            return db.execute(sql, args).fetchall()

    def outbox(self, pid: str) -> list[dict]:
        """The lab's outbox rows, oldest first (state, round, nonce, answer, code, sends)."""
        path = lab_outbox(self.tmp / pid)
        if not path.exists():
            return []
        with read_only(path) as db:
            db.row_factory = sqlite3.Row
            return [dict(r) for r in db.execute("SELECT * FROM outbox ORDER BY id")]

    def received(self, pid: str, plan_round: int) -> bool:
        """Whether the lab has taken in the update that plans `plan_round` (written before its step)."""
        path = lab_outbox(self.tmp / pid)
        if not path.exists():
            return False
        try:
            with read_only(path) as db:
                return db.execute("SELECT 1 FROM received WHERE plan_round=?", (plan_round,)).fetchone() is not None
        except sqlite3.OperationalError:  # the lab is creating the file
            return False

    def wait_received(self, pid: str, plan_round: int, timeout: float = 240.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.received(pid, plan_round):
            proc = self.labs[pid]
            assert proc.popen.poll() is None, f"{pid} exited:\n{proc.text()[-3000:]}"
            assert time.monotonic() < deadline, f"{pid} never received round {plan_round}:\n{proc.text()[-3000:]}"
            time.sleep(0.02)

    def receipts(self, pid: str) -> list[SubmissionReceipt]:
        """Every signed receipt the lab holds, verified with the coordinator's key."""
        public = load_public_key(self.server_dir / "coordinator.pub")
        trusted = {key_id(public): public}
        out = []
        for entry in self.outbox(pid):
            final = decode_key(entry["update_key"])[2] is None  # the final report: answered by the final ack
            if entry["state"] == "acked" and not final:
                answer = open_answer(bytes(entry["answer"]), trusted)
                assert isinstance(answer, SubmissionReceipt), answer
                out.append(answer)
        return out

    def check_receipts_in_journal(self, pids: list[str], complete: bool = True) -> dict[str, int]:
        """Every trajectory a lab holds a receipt for is in the journal exactly once, and (`complete`:
        the run is over and every answer delivered) the journal holds no trajectory or submission of
        that lab without a receipt; returns the receipted count per lab."""
        counts = {}
        for pid in pids:
            receipts = self.receipts(pid)
            receipted = [t for r in receipts for t in r.accepted_trajectory_ids]
            assert len(receipted) == len(set(receipted)), f"{pid}: a trajectory in two receipts"
            journal = self.rows("SELECT trajectory_id, COUNT(*) FROM trajectories WHERE participant_id=? "
                                "GROUP BY trajectory_id", pid)
            assert all(n == 1 for _, n in journal)
            held = {t for t, _ in journal}
            assert set(receipted) <= held, (pid, sorted(set(receipted) - held))
            seqs = {r.seq for r in receipts}
            stored = {s for (s,) in self.rows("SELECT seq FROM submissions WHERE participant_id=?", pid)}
            assert seqs <= stored, (pid, seqs, stored)
            if complete:
                assert sorted(receipted) == sorted(held) and seqs == stored, (pid, receipted, journal, seqs, stored)
            counts[pid] = len(receipted)
        return counts

    def integrity(self) -> str:
        (result,), = self.rows("PRAGMA integrity_check")
        return result


def _describe(pid: int) -> str:
    try:
        return f"{pid} {' '.join(psutil.Process(pid).cmdline())[:200]}"
    except psutil.NoSuchProcess:
        return str(pid)
