"""examples/hacfed-task-example/README.md's federation, run exactly as written (issue 43).

The commands are read from the README's bash blocks and run in order in a fresh directory laid out
like the clone (examples/hacfed-task-example copied in), with the substitutions of the main README's
walk-through test (tests/integration/test_tls_walkthrough.py, whose machinery this reuses): each
command's first word is this venv's script, port 9092 a free one. `pip install -e` is not run: it
would point this venv's package at the temporary copy; scripts/bootstrap.sh installed the same
package from the clone, which this checks instead. The long-running commands start in the
background, as in their own terminals.

Besides the README's commands, two labs that the coordinator cannot take join first:
- lab-c, whose keys exist but were never registered: it must say so in one line and exit 2 within
  seconds (the coordinator knows at its first hello);
- lab-m, registered, whose [task] is another (built-in arithmetic): it must say "task mismatch" in
  one line and exit 2, and no round may wait for it (every round closes at quorum, none at its
  300 s deadline).
The registered labs must learn: some verified reward > 0 on the example's own task.

The run is in the long tier (`./scripts/test.sh --long`): lab-a is SmolLM2-135M, whose loading and
three updates on CPU took a quarter of the default run's budget (docs/results.md, "The test suite").
The default run checks its parts: the README's commands are the ones this run plays
(`test_the_readme_commands_are_the_ones_the_run_plays` below), the example's plugin task in a real
federation of hacfed-server and hacfed-client processes with verified rewards above 0
(test_task_plugin_federation.py), the README walk-through's machinery (test_tls_walkthrough.py), the
refusal of a lab on another task and of an unregistered one, neither waited for
(tests/unit/test_lab_refusals.py), and SmolLM2 co-training with a tiny agent (test_smollm2_cotrain.py).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib.metadata import distribution, entry_points
from pathlib import Path

import pytest

from hacfed.procs import free_port
from tests.integration.test_tls_walkthrough import as_run, start, stop
from tests.processes import REPO, Proc, cli_env, running_descendants

EXAMPLE = REPO / "examples" / "hacfed-task-example"
LONG_RUNNING = (("hacfed-server", "--config"), ("hacfed-client", "--config"))
REFUSED_WITHIN_S = 45.0  # generous: the refusal rides on the hello sent again at once (before: after 60 s)
ANOTHER_TASK = '[task]\nkind = "arithmetic"\ndigits = 2\noperators = "+"\n'
PLAYED = [["pip", "install"], ["hacfed-client", "keys"], ["hacfed-client", "keys"], ["hacfed-server", "register"],
          ["hacfed-server", "register"], ["hacfed-server", "--config"], ["hacfed-client", "--config"],
          ["hacfed-client", "--config"]]  # the README's commands, by their first two words


def readme_commands() -> list[str]:
    """The commands of the README's bash blocks, continuation lines joined, comments left out."""
    blocks = re.findall(r"```bash\n(.*?)```", (EXAMPLE / "README.md").read_text(encoding="utf-8"), flags=re.S)
    assert blocks, "no bash block in the example's README"
    joined = re.sub(r"\\\n\s*", " ", "\n".join(blocks))
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


@dataclass
class Run:
    root: Path
    procs: dict[str, Proc] = field(default_factory=dict)
    codes: dict[str, int] = field(default_factory=dict)
    refused_after_s: float | None = None
    leftovers: set[int] = field(default_factory=set)

    def journal(self, query: str) -> list[tuple]:
        path = self.root / "state" / "example" / "coordinator" / "journal.sqlite"
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            return db.execute(query).fetchall()


def _run(argv: list[str], root: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (argv, done.stdout, done.stderr)
    return done


def _labs_it_cannot_take(run: Run, lab_command: str, port: int, env: dict[str, str]) -> None:
    """lab-c (never registered) and lab-m (registered, on another task), started with the README's
    command of lab-b (a tiny preset); lab-c must be gone before the README's labs join."""
    root = run.root
    _run(as_run("hacfed-client keys --state-dir state/example/lab-c --participant-id lab-c", port), root, env)
    _run(as_run("hacfed-client keys --state-dir state/example/lab-m --participant-id lab-m", port), root, env)
    _run(as_run("hacfed-server register --state-dir state/example/coordinator state/example/lab-m/enrolment.txt",
                port), root, env)
    other = root / "another-task.toml"
    other.write_text(ANOTHER_TASK)
    lab_m = lab_command.replace("lab-b", "lab-m").replace("examples/hacfed-task-example/participant.toml", str(other))
    run.procs["lab-m"] = start("lab-m", as_run(lab_m, port), root, env)
    lab_c = run.procs["lab-c"] = start("lab-c", as_run(lab_command.replace("lab-b", "lab-c"), port), root, env)
    lab_c.wait_for(r"hacfed-client: connected to ", timeout=600)
    connected = time.monotonic()
    run.codes["lab-c"] = lab_c.popen.wait(timeout=300)
    run.refused_after_s = time.monotonic() - connected
    run.procs["server"].wait_for(r"joined: lab-m", timeout=600)


def _play(run: Run, commands: list[str], env: dict[str, str], port: int) -> None:
    for command in commands:
        words = shlex.split(command)
        if words[0] == "pip":  # installed by scripts/bootstrap.sh from the clone (see the module docstring)
            assert words[1:4] == ["install", "--no-deps", "-e"] and words[4] == "examples/hacfed-task-example"
            continue
        if tuple(words[:2]) not in LONG_RUNNING:
            _run(as_run(command, port), run.root, env)
            continue
        if words[0] == "hacfed-server":
            server = run.procs["server"] = start("server", as_run(command, port), run.root, env)
            server.wait_for(rf"ready: Fleet API on 127\.0\.0\.1:{port} ", timeout=600)
            lab_b = next(c for c in commands if "--participant-id lab-b" in c and "--config" in c)
            _labs_it_cannot_take(run, lab_b, port, env)
            continue
        name = words[words.index("--participant-id") + 1]
        run.procs[name] = start(name, as_run(command, port), run.root, env)


@pytest.fixture(scope="module")
def example_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    root = tmp_path_factory.mktemp("task-example")
    shutil.copytree(EXAMPLE, root / "examples" / "hacfed-task-example",
                    ignore=shutil.ignore_patterns("*.egg-info", "__pycache__", "state"))
    env = {**cli_env(), "OMP_NUM_THREADS": "1"}
    commands = readme_commands()
    assert [shlex.split(c)[:2] for c in commands] == PLAYED, commands
    run = Run(root)
    before = running_descendants()
    try:
        _play(run, commands, env, free_port())
        run.codes["server"] = run.procs["server"].popen.wait(timeout=1800)
        for name in ("lab-a", "lab-b", "lab-m"):
            run.codes[name] = run.procs[name].popen.wait(timeout=300)
        yield run
    finally:
        for proc in run.procs.values():
            stop(proc)
        run.leftovers = running_descendants() - before


def test_the_readme_commands_are_the_ones_the_run_plays() -> None:
    """What the long-tier run below plays: the same commands in the same order, each config they name in
    the example, and lab-a on the model whose reward the run checks."""
    commands = readme_commands()
    assert [shlex.split(c)[:2] for c in commands] == PLAYED, commands
    for command in commands:
        words = shlex.split(command)
        if "--config" in words:
            assert (REPO / words[words.index("--config") + 1]).is_file(), command
    lab_a = next(c for c in commands if "--participant-id lab-a" in c and "--config" in c)
    assert "--model smollm2" in lab_a, lab_a


@pytest.mark.slow
def test_the_task_package_is_installed_from_the_clone() -> None:
    """What the README's `pip install` does, done by scripts/bootstrap.sh: the entry point, from the clone."""
    assert [ep.value for ep in entry_points(group="hacfed.tasks", name="reverse-word")] == ["hacfed_task_example"]
    source = json.loads(distribution("hacfed-task-example").read_text("direct_url.json") or "{}")
    assert source.get("dir_info", {}).get("editable") and source["url"].endswith("examples/hacfed-task-example")


@pytest.mark.slow
@pytest.mark.long
def test_the_readme_federation_runs_to_the_end_and_its_labs_earn_reward(example_run: Run) -> None:
    server = example_run.procs["server"].text()
    assert example_run.codes["server"] == 0, server[-4000:]
    assert "federation finished: 3 rounds, final reports from ['lab-a', 'lab-b']" in server, server[-4000:]
    for lab in ("lab-a", "lab-b"):
        assert example_run.codes[lab] == 0, example_run.procs[lab].text()[-3000:]
        assert "task reverse-word" in example_run.procs[lab].text()
    by_lab = dict(example_run.journal("SELECT participant_id, MAX(reward) FROM trajectories GROUP BY participant_id"))
    assert set(by_lab) == {"lab-a", "lab-b"}, by_lab
    assert max(by_lab.values()) > 0.0, by_lab  # the coordinator's verified reward on the example's task
    rows = [json.loads(line) for line in
            (example_run.root / "state" / "example" / "coordinator" / "metrics.jsonl").read_text().splitlines()]
    assert any((r.get("reward_mean") or 0.0) > 0.0 for r in rows if r.get("agent") in ("lab-a", "lab-b")), rows


@pytest.mark.slow
@pytest.mark.long
def test_a_lab_that_is_not_registered_says_so_in_one_line_and_exits_2_within_seconds(example_run: Run) -> None:
    lab_c = example_run.procs["lab-c"].text()
    assert example_run.codes["lab-c"] == 2, lab_c[-3000:]
    refusals = [line for line in lab_c.splitlines() if "HACFED-E-UNKNOWN-PARTICIPANT" in line]
    assert refusals == [refusals[-1]] and refusals[0].startswith("hacfed-client: the coordinator refused this lab "
                                                                 "(HACFED-E-UNKNOWN-PARTICIPANT): lab-c is not "
                                                                 "registered"), lab_c[-3000:]
    assert lab_c.rstrip().endswith("Stopping (exit code 2)."), lab_c[-3000:]
    assert example_run.refused_after_s is not None and example_run.refused_after_s < REFUSED_WITHIN_S, \
        example_run.refused_after_s
    assert "joined: lab-c" not in example_run.procs["server"].text()


@pytest.mark.slow
@pytest.mark.long
def test_a_lab_on_another_task_says_so_exits_2_and_no_round_waits_for_it(example_run: Run) -> None:
    lab_m = example_run.procs["lab-m"].text()
    assert example_run.codes["lab-m"] == 2, lab_m[-3000:]
    mismatches = [line for line in lab_m.splitlines() if "task mismatch" in line]
    assert len(mismatches) == 1 and "is unknown to this client's task arith-add2" in mismatches[0], lab_m[-3000:]
    assert "lab-m is on another task (HACFED-E-TASK-MISMATCH" in example_run.procs["server"].text()
    reasons = example_run.journal("SELECT round_id, close_reason FROM rounds ORDER BY round_id")
    assert reasons == [(r, "quorum") for r in range(3)], reasons
    assert example_run.journal("SELECT COUNT(*) FROM trajectories WHERE participant_id = 'lab-m'") == [(0,)]


@pytest.mark.slow
@pytest.mark.long
def test_every_process_of_the_example_stops(example_run: Run) -> None:
    assert example_run.leftovers == set()
    assert all(proc.popen.poll() is not None for proc in example_run.procs.values())
