"""Run a modes matrix: one `hacfed sim` subprocess per (setting, mode, seed), a few at a time, resumable.

    hacfed bench modes --matrix bench/modes.toml --out runs/modes --jobs 2

Layout under OUT: `SETTING/MODE/seed-S.jsonl` (the metrics, only once the run is complete),
`seed-S.jsonl.partial` (written while it runs), `seed-S.log` (its output) and `seed-S.args.json`
(the `hacfed sim` arguments that made it). A run counts as complete when the child exited 0 and every
agent has its `"final": true` row; only then is the partial file renamed. On restart complete runs
are skipped and anything else is rerun from scratch; a complete file made with other arguments is an
error rather than silently reused. Children get their own process group and are stopped by pid
(`hacfed.procs`), also on Ctrl-C and SIGTERM.

Two invocations on the same OUT (two terminals, or a restart while the first still runs) share the
work instead of running a run twice: each run holds an exclusive lock on `seed-S.lock` while it runs,
and a run is checked again just before it starts. A run that another invocation holds, or completed
meanwhile, is skipped with a line saying so.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from hacfed.procs import ManagedProcess, ProcessSupervisor
from hacfed.tools.experiments.matrix import Matrix, Setting

LOG_TAIL_LINES = 20


class StaleRunError(ValueError):
    """A complete run on disk was made by different `hacfed sim` arguments than the matrix asks for."""


@dataclass(frozen=True)
class Run:
    setting: str
    mode: str
    seed: int
    agent_ids: tuple[str, ...]
    sim_args: tuple[str, ...]  # after `hacfed`, without --metrics-out

    @property
    def label(self) -> str:
        return f"{self.setting}/{self.mode} seed {self.seed}"

    def _path(self, out: Path, suffix: str) -> Path:
        return Path(out) / self.setting / self.mode / f"seed-{self.seed}{suffix}"

    def metrics_path(self, out: Path) -> Path:
        return self._path(out, ".jsonl")

    def partial_path(self, out: Path) -> Path:
        return self._path(out, ".jsonl.partial")

    def log_path(self, out: Path) -> Path:
        return self._path(out, ".log")

    def args_path(self, out: Path) -> Path:
        return self._path(out, ".args.json")

    def lock_path(self, out: Path) -> Path:
        return self._path(out, ".lock")


def claim(run: Run, out: Path) -> int | None:
    """An open descriptor holding the run's exclusive lock, or None when another process holds it.
    The lock goes with the descriptor (closed, or the process gone)."""
    path = run.lock_path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def sim_args(setting: Setting, mode: str, seed: int) -> tuple[str, ...]:
    r = setting.run
    return (
        "sim", "--agents", ",".join(setting.agents), "--mode", mode, "--seed", str(seed), "--task", r.task,
        "--rounds", str(r.rounds), "--lr", repr(r.lr), "--eval-every", str(r.eval_every),
        "--eval-problems", str(r.eval_problems), "--eval-split", r.eval_split,
        "--prompts-per-round", str(r.prompts_per_round), "--group-size", str(r.group_size),
        "--threads", "1", "--quiet",
    ) + (("--eval-sampled",) if r.eval_sampled else ()) + (() if r.eval_start else ("--no-eval-start",)) \
      + (("--minibatch-size", str(r.minibatch_size)) if r.minibatch_size is not None else ()) \
      + (("--peers-per-prompt", str(r.peers_per_prompt)) if r.peers_per_prompt is not None else ()) \
      + (("--peer-choice", r.peer_choice) if r.peer_choice is not None else ()) \
      + (("--finetune", r.finetune) if r.finetune is not None else ()) \
      + (() if r.text_filter else ("--no-text-filter",)) \
      + (("--answer-keys", r.answer_keys) if r.answer_keys is not None else ()) \
      + (("--dedup-successes",) if r.dedup_successes else ()) \
      + (("--format-gate",) if r.format_gate else ()) \
      + tuple(a for text in r.deny for a in ("--deny", text)) \
      + (("--max-staleness", str(r.max_staleness)) if r.max_staleness else ()) \
      + tuple(a for speed in r.lab_speed for a in ("--lab-speed", speed)) \
      + (("--round-join", r.round_join) if r.round_join != "every" else ()) \
      + (("--temperature", repr(r.temperature)) if r.temperature is not None else ()) \
      + (("--max-new-tokens", str(r.max_new_tokens)) if r.max_new_tokens is not None else ())


def runs_of(setting: Setting) -> list[Run]:
    """The setting's runs, seed-major so that the modes of one seed (a paired set) finish together."""
    return [Run(setting.name, mode, seed, setting.evaluated_ids, sim_args(setting, mode, seed))
            for seed in setting.run.seeds for mode in setting.run.modes]


def plan_runs(matrix: Matrix, only: Sequence[str] = ()) -> list[Run]:
    """Every run of the selected settings (when `only` is empty: every setting not archived)."""
    settings = [matrix.setting(name) for name in only] if only else [s for s in matrix.settings if not s.archived]
    return [run for s in settings for run in runs_of(s)]


def has_final_rows(path: Path, agent_ids: Sequence[str]) -> bool:
    """True when the JSONL file parses and holds a `"final": true` row with an accuracy for every agent."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
        rows = [json.loads(line) for line in lines if line.strip()]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    finals = {r.get("agent") for r in rows
              if isinstance(r, dict) and r.get("final") is True and isinstance(r.get("eval_accuracy"), (int, float))}
    return set(agent_ids) <= finals


def is_complete(run: Run, out: Path) -> bool:
    """The run's metrics file exists; raises StaleRunError if it was made with other arguments."""
    path = run.metrics_path(out)
    if not path.exists():
        return False
    try:
        recorded = json.loads(run.args_path(out).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        recorded = None
    if recorded != list(run.sim_args):
        raise StaleRunError(
            f"{path} was not made by this matrix's command for it (see {run.args_path(out).name}); "
            f"delete {path.parent} to rerun it, or use another --out"
        )
    return True


def split_done(runs: Sequence[Run], out: Path) -> tuple[list[Run], list[Run]]:
    """(complete, to_run): complete runs are skipped; partial or missing ones are (re)run."""
    done = [r for r in runs if is_complete(r, out)]
    return done, [r for r in runs if r not in done]


def command_line(run: Run, out: Path, python: str = sys.executable) -> list[str]:
    return [python, "-m", "hacfed.tools.cli", *run.sim_args, "--metrics-out", str(run.partial_path(out))]


class _Progress:
    """One line per started / finished run: elapsed time, runs complete out of total, ETA."""

    def __init__(self, total: int, done: int, jobs: int, echo: Callable[[str], None]) -> None:
        self.total, self.done, self.failed, self.jobs, self.echo = total, done, 0, jobs, echo
        self.t0 = time.monotonic()
        self.durations: list[float] = []  # of the runs that completed in this invocation

    def line(self, text: str) -> None:
        self.echo(f"[{_clock(time.monotonic() - self.t0)}] {text}")

    def skipped(self, complete: bool) -> None:
        """A run left to another invocation (or that it completed): not this one's to count or time."""
        if complete:
            self.done += 1
        else:
            self.total -= 1

    def settled(self, seconds: float, ok: bool) -> str:
        """Count a finished run; the ETA is the mean time of a complete run × runs left / jobs."""
        if ok:
            self.done += 1
            self.durations.append(seconds)
        else:
            self.failed += 1
        left = self.total - self.done - self.failed
        text = f"{self.done}/{self.total} complete" + (f", {self.failed} failed" if self.failed else "")
        if left and self.durations:
            text += f", ETA {_clock(sum(self.durations) / len(self.durations) * left / self.jobs)}"
        return text


def run_matrix(
    runs: Sequence[Run], out: Path, *, jobs: int = 2, python: str = sys.executable,
    echo: Callable[[str], None] = print, poll_s: float = 0.2,
) -> list[Run]:
    """Run what is not complete yet, `jobs` at a time; returns the runs that failed."""
    if jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {jobs}")
    out = Path(out)
    done, todo = split_done(runs, out)
    progress = _Progress(len(runs), len(done), jobs, echo)
    if done:
        progress.line(f"{len(done)} of {len(runs)} runs already complete under {out}: skipped")
    pending: deque[Run] = deque(todo)
    running: dict[Run, tuple[ManagedProcess, float, int]] = {}
    failed: list[Run] = []
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.setdefault("OMP_NUM_THREADS", "1")  # one torch thread per run: `jobs` runs share the cores
    try:
        with ProcessSupervisor() as supervisor:
            while pending or running:
                while pending and len(running) < jobs:
                    run = pending.popleft()
                    lock = claim(run, out)
                    if lock is None or is_complete(run, out):
                        if lock is not None:
                            os.close(lock)
                        progress.line(f"skip  {run.label}: " + ("another hacfed bench modes is running it"
                                                                 if lock is None else "completed meanwhile"))
                        progress.skipped(lock is not None)
                        continue
                    running[run] = (_start(supervisor, run, out, python, env), time.monotonic(), lock)
                    progress.line(f"start {run.label} ({len(running)} running, {len(pending)} waiting)")
                time.sleep(poll_s)
                for run, (proc, started, lock) in list(running.items()):
                    code = proc.returncode()
                    if code is None:
                        continue
                    del running[run]
                    supervisor.stop(proc)  # the run is over; make sure nothing it started lingers
                    seconds = time.monotonic() - started
                    ok = code == 0 and has_final_rows(run.partial_path(out), run.agent_ids)
                    if ok:
                        _publish(run, out)
                        progress.line(f"done  {run.label} in {seconds:.0f} s; {progress.settled(seconds, ok)}")
                    else:
                        failed.append(run)
                        why = f"exit {code}" if code else "no final row for every agent"
                        progress.line(f"FAILED {run.label} ({why}) after {seconds:.0f} s; "
                                      f"{progress.settled(seconds, ok)}; "
                                      f"log {run.log_path(out)}:\n{_tail(run.log_path(out))}")
                    os.close(lock)  # published or failed: another invocation may take it now
    except (KeyboardInterrupt, SystemExit):
        progress.line(f"interrupted: stopped {len(running)} running run(s); rerun the same command to resume")
        raise
    finally:
        for _, _, lock in running.values():
            os.close(lock)
    return failed


def _start(supervisor: ProcessSupervisor, run: Run, out: Path, python: str, env: dict[str, str]) -> ManagedProcess:
    for stale in (run.partial_path(out), run.log_path(out), run.args_path(out)):
        stale.unlink(missing_ok=True)
    argv = command_line(run, out, python)
    log = run.log_path(out)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("$ " + shlex.join(argv) + "\n", encoding="utf-8")
    return supervisor.start(argv, env=env, log_path=log, name=run.label)


def _publish(run: Run, out: Path) -> None:
    """Record the arguments, then rename partial -> final (the rename is what marks it complete)."""
    args_tmp = run.args_path(out).with_suffix(".tmp")
    args_tmp.write_text(json.dumps(list(run.sim_args)) + "\n", encoding="utf-8")
    os.replace(args_tmp, run.args_path(out))
    os.replace(run.partial_path(out), run.metrics_path(out))


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "    (no log)"
    return "\n".join("    " + line for line in text.splitlines()[-lines:])


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}"
