"""A lab's own task (hacfed.tasks.plugin): a reward from an installed package, run only in its sandbox.

The example package (examples/hacfed-task-example, entry point `reverse-word`) is installed in the
test environment by scripts/bootstrap.sh --test; the misbehaving plugins of tests/plugin_fakes.py are real
entry points too, through a dist-info folder put on sys.path.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Iterator

import pytest

from hacfed.messages import Submission
from hacfed.server.coordinator import Coordinator, Journal
from hacfed.server.coordinator.errors import ErrorCode
from hacfed.tasks.plugin import PluginTask
from hacfed.tasks.plugin_worker import call_reward, load_problems
from hacfed.tasks.registry import TASK_KINDS, load_task
from hacfed.tasks.sandbox import VERIFIER_ABORT, network_isolation_prefix
from hacfed.trajectory import Trajectory
from tests.plugin_fakes import EVAL_DATA, GOOD_DATA, install_fakes
from tests.unit.test_coordinator_fakes import FakeClock, make_config

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "hacfed-task-example"
# datasets' cache in the clone's temporary space, not in the home directory
CACHE = {"cache_dir": str(Path(tempfile.gettempdir()) / f"hacfed-plugin-tests-{os.getpid()}")}
SPEC = {"kind": "plugin", "plugin": "reverse-word", "train_files": "data/train.jsonl", "eval_files": "data/eval.jsonl",
        **CACHE}


@pytest.fixture(scope="module", autouse=True)
def _cache() -> Iterator[None]:
    yield
    shutil.rmtree(CACHE["cache_dir"], ignore_errors=True)


@pytest.fixture(scope="module")
def example() -> Iterator[PluginTask]:
    task = load_task(SPEC, base_dir=EXAMPLE)
    yield task
    task.close()


@pytest.fixture
def fakes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fake plugins installed (their metadata on sys.path) and their data files in tmp_path."""
    install_fakes(tmp_path / "site")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    for name, rows in (("train.jsonl", GOOD_DATA), ("eval.jsonl", EVAL_DATA)):
        (tmp_path / name).write_text(
            "".join(f'{{"question": "{r["question"]}", "answer": "{r["answer"]}"}}\n' for r in rows)
        )
    return tmp_path


def fake(name: str, directory: Path, files: bool = True, **kw) -> PluginTask:
    spec = {"kind": "plugin", "plugin": name, **CACHE, **kw}
    if files:
        spec |= {"train_files": "train.jsonl", "eval_files": "eval.jsonl"}
    return load_task(spec, base_dir=directory)


def refusal(call) -> str:
    with pytest.raises(ValueError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message
    return message


# ----------------------------------------------------------------------------- the example package


def test_example_plugin_scores_in_its_sandbox_not_in_this_process(example: PluginTask) -> None:
    assert "plugin" in TASK_KINDS and example.name == "reverse-word"
    assert (len(example.train_problems()), len(example.eval_problems())) == (48, 10)
    problem = example.train_problems()[0]
    assert problem.prompt_id.startswith("reverse-word:") and problem.answer == "elppa"
    assert problem.messages[-1].content == "Write the word backwards: apple\nAnswer:"  # the plugin's template
    assert example.verify(problem, " so it is elppa ").reward == 1.0
    assert example.verify(problem, "zzzzz").reward == 0.0
    assert example.verify(problem, "elppx").reward == 0.8  # partial credit: four letters in place
    assert example.problem(problem.prompt_id) is problem
    assert "hacfed_task_example" not in sys.modules  # only the worker imported it
    assert example._worker.pid not in (None, os.getpid())


def test_problems_from_the_plugin_when_the_task_names_no_files() -> None:
    task = load_task({"kind": "plugin", "plugin": "reverse-word", "prompt_template": "Reverse {question}.",
                      "system_prompt": "Be brief.", "max_train": 5})
    try:
        files = load_task(SPEC, base_dir=EXAMPLE)
        files.close()
        assert [p.prompt_id for p in task.eval_problems()] == [p.prompt_id for p in files.eval_problems()]
        assert len(task.train_problems()) == 5
        assert [m.content for m in task.train_problems()[0].messages] == ["Be brief.", "Reverse apple."]
        assert task.verify(task.eval_problems()[0], "otamot").reward == 1.0
    finally:
        task.close()


def test_num_validation_sets_the_last_train_problems_aside(example: PluginTask) -> None:
    """A lab chooses its settings on the validation split, never on the eval (test) problems."""
    task = load_task({**SPEC, "num_validation": 8}, base_dir=EXAMPLE)
    try:
        ids = lambda problems: [p.prompt_id for p in problems]  # noqa: E731
        everything = ids(example.train_problems())
        assert ids(task.validation_problems()) == everything[-8:]
        assert ids(task.train_problems()) == everything[:-8]  # never trained on, never in a plan
        assert ids(task.eval_problems()) == ids(example.eval_problems())
        assert example.validation_problems() == ()  # the default: no validation split
        held_out = task.validation_problems()[0]
        assert task.verify(held_out, held_out.solution).reward == 1.0
    finally:
        task.close()
    assert "not more than num_validation 1000" in refusal(lambda: load_task({**SPEC, "num_validation": 1000},
                                                                            base_dir=EXAMPLE))
    assert "'num_validation' must be an integer >= 0" in refusal(lambda: load_task({**SPEC, "num_validation": -1},
                                                                                   base_dir=EXAMPLE))


def test_example_coordinator_config_loads() -> None:
    from hacfed.server.coordinator import load_coordinator_config, load_task_from_config

    cfg = load_coordinator_config(EXAMPLE / "coordinator.toml", {"task.cache_dir": CACHE["cache_dir"]})
    task = load_task_from_config(cfg, str(EXAMPLE))
    try:
        assert task.name == "reverse-word" and len(task.eval_problems()) == 10
    finally:
        task.close()


def test_the_example_lab_config_has_the_coordinators_task(tmp_path: Path) -> None:
    from hacfed.clients.config import load_client_config
    from hacfed.keys import ensure_key_pair
    from hacfed.server.coordinator import load_coordinator_config

    key = ensure_key_pair(tmp_path, "coordinator").public
    lab = load_client_config(EXAMPLE / "participant.toml", {
        "model": "tiny-llama", "server": "127.0.0.1:9092", "participant_id": "lab-a",
        "state_dir": str(tmp_path / "lab"),
        "coordinator_key": str(key), "insecure": True})
    assert lab.task == dict(load_coordinator_config(EXAMPLE / "coordinator.toml").task)
    assert lab.config_dir == EXAMPLE  # so both resolve data/... to the same files


# ----------------------------------------------------------------------------- data in any format


def test_a_csv_task_with_its_own_field_names(tmp_path: Path) -> None:
    (tmp_path / "train.csv").write_text("word,backwards,n\napple,elppa,1\nriver,revir,2\n")
    (tmp_path / "eval.csv").write_text("word,backwards,n\nstone,enots,3\n")
    task = load_task({**SPEC, "train_files": "train.csv", "eval_files": ["eval.csv"], "question_field": "word",
                      "answer_field": "backwards", "name": "mine"}, base_dir=tmp_path)
    try:
        assert [p.answer for p in task.train_problems()] == ["elppa", "revir"]
        assert task.eval_problems()[0].prompt_id.startswith("mine:")
        assert task.verify(task.eval_problems()[0], "enots").reward == 1.0
    finally:
        task.close()


@pytest.mark.parametrize(
    ("setup", "spec", "words"),
    [
        (lambda d: None, {"train_files": "nope.jsonl"}, "data file not found: "),
        (lambda d: (d / "t.jsonl").write_text(""), {"train_files": "t.jsonl"}, "data file is empty: "),
        (lambda d: (d / "t.jsonl").write_text('{"q": "a", "answer": "b"}\n'), {"train_files": "t.jsonl"},
         "missing field(s) ['question']; the records have ['q', 'answer']"),
        (lambda d: (d / "t.csv").write_text("question,answer\n"), {"train_files": "t.csv"}, "t.csv: no records"),
        (lambda d: (d / "t.txt").write_text("x"), {"train_files": "t.txt"}, "unknown data format '.txt'"),
        (lambda d: (d / "t.jsonl").write_text("{not json\n"), {"train_files": "t.jsonl"}, "t.jsonl, line 1: not valid"),
        (lambda d: (d / "t.jsonl").write_text("[1, 2]\n"), {"train_files": "t.jsonl"}, "line 1: a JSON list, not an"),
        (lambda d: (d / "dir").mkdir(), {"train_files": "dir"}, "cannot be read as disk"),
        (lambda d: (d / "t.jsonl").write_text('{"question": "", "answer": "b"}\n'), {"train_files": "t.jsonl"},
         "record 1: field 'question' must be non-empty text"),
        (lambda d: (d / "t.jsonl").write_text('{"question": "xy", "answer": "b"}\n'), {"train_files": "t.jsonl"},
         "no train problems left after removing eval questions"),
    ],
)
def test_data_mistakes_are_one_line_naming_the_file(tmp_path: Path, setup, spec, words: str) -> None:
    setup(tmp_path)
    (tmp_path / "e.jsonl").write_text('{"question": "xy", "answer": "yx"}\n')
    message = refusal(lambda: load_task({**SPEC, "eval_files": "e.jsonl", **spec}, base_dir=tmp_path))
    assert words in message, message


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"plugin": "reverse-word", "shape": 1}, "unknown key(s) ['shape']"),
        ({"train_files": "a.jsonl"}, "'plugin' is required"),
        ({"plugin": "reverse word"}, "'plugin' must match"),
        ({"plugin": "reverse-word", "train_files": "a.jsonl"}, "give both 'train_files' and 'eval_files'"),
        ({"plugin": "reverse-word", "prompt_template": "no slot"}, "must contain '{question}'"),
        ({"plugin": "reverse-word", "sandbox": {"timeout": 1}}, "unknown key(s) ['timeout'] in 'sandbox'"),
        ({"plugin": "reverse-word", "sandbox": {"timeout_s": -1}}, "timeout_s must be in (0, 600]"),
        ({"plugin": "reverse-word", "max_train": 0}, "'max_train' must be an integer >= 1"),
        ({"plugin": "not-installed-anywhere"}, "task plugin 'not-installed-anywhere' is not installed: no entry "
                                               "point 'not-installed-anywhere' in group 'hacfed.tasks' (installed: "),
    ],
)
def test_config_mistakes_are_one_line(spec, words: str) -> None:
    message = refusal(lambda: load_task({"kind": "plugin", **spec}))
    assert words in message, message
    if "not installed" in message:
        assert "'reverse-word'" in message  # the installed ones are named


# ----------------------------------------------------------------------------- misbehaving plugins


@pytest.mark.parametrize(
    ("name", "files", "words"),
    [
        ("fake-import-error", True, "task plugin 'fake-import-error' failed to load "
                                    "(tests.plugin_fakes_missing_module): "
                                    "ModuleNotFoundError"),
        ("fake-no-reward", True, "task plugin 'fake-no-reward' failed to load (tests.plugin_fakes:NoReward): "
                                 "TypeError: <class 'tests.plugin_fakes.NoReward'> has no reward(problem, response)"),
        ("fake-int", True, "task plugin 'fake-int' reward failed on the first train problem: reward returned int, "
                           "not a float (1)"),
        ("fake-range", True, "task plugin 'fake-range' reward failed on the first train problem: reward returned a "
                             "value outside [0, 1] (2.0)"),
        ("fake-raises", True, "task plugin 'fake-raises' reward failed on the first train problem: reward raised "
                              "KeyError ('no such field')"),
        ("fake-bad-problems", False, "task plugin 'fake-bad-problems' problems('train') failed: problems('train') "
                                     "item 0 is not a dict with a 'question' string"),
        ("fake-empty-split", False, "task plugin 'fake-empty-split': problems('eval') gave no problems"),
        ("fake-no-problems", False, "task plugin 'fake-no-problems' provides no problems(split): give the [task] "
                                    "'train_files' and 'eval_files'"),
    ],
)
def test_a_broken_plugin_is_refused_in_one_line_naming_it(fakes: Path, name: str, files: bool, words: str) -> None:
    message = refusal(lambda: fake(name, fakes, files=files))
    assert words in message, message


@pytest.mark.parametrize(("plugin", "words"), [
    ("not-installed-anywhere", "task plugin 'not-installed-anywhere' is not installed"),
    ("fake-range",
     "task plugin 'fake-range' reward failed on the first train problem: reward returned a value outside"),
])
def test_hacfed_server_refuses_a_bad_plugin_in_one_line_before_writing(fakes: Path, plugin: str, words: str) -> None:
    (fakes / "coordinator.toml").write_text(
        'run_id = "x"\nrounds = 1\nprompts_per_round = 1\ngroup_size = 1\nexpected_participants = 1\n'
        'min_participants = 1\nround_deadline_s = 10\nstate_dir = "state"\n[task]\nkind = "plugin"\n'
        f'plugin = "{plugin}"\ntrain_files = "train.jsonl"\neval_files = "eval.jsonl"\n'
        f'cache_dir = "{CACHE["cache_dir"]}"\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fakes / "site"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([str(Path(sys.executable).parent / "hacfed-server"), "--config", "coordinator.toml",
                           "--insecure"], cwd=fakes, env=env, capture_output=True, text=True, timeout=300)
    lines = (done.stdout + done.stderr).splitlines()
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("hacfed-server: error: "), lines
    assert words in lines[0] and not (fakes / "state").exists()


def test_a_plugin_installed_twice_is_refused(fakes: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install_fakes(fakes / "other", "other-plugins", {"fake-int": "tests.plugin_fakes:exact"})
    monkeypatch.syspath_prepend(str(fakes / "other"))
    refused = refusal(lambda: fake("fake-int", fakes))
    assert "task plugin 'fake-int' is provided by more than one installed package" in refused


def test_a_plain_function_entry_point_is_the_reward(fakes: Path) -> None:
    task = fake("fake-no-problems", fakes)
    try:
        assert task.train_problems()[0].messages[-1].content == "ab"  # default template: the question
        assert [task.verify(task.train_problems()[0], r).reward for r in ("ba", "ab")] == [1.0, 0.0]
    finally:
        task.close()


def test_plugin_problems_and_template(fakes: Path) -> None:
    task = fake("fake-provides", fakes, files=False)
    try:
        assert [p.messages[-1].content for p in task.train_problems()] == ["Q: ab", "Q: cd"]
        assert [p.solution for p in task.eval_problems()] == ["yx"]  # no solution given: the answer
    finally:
        task.close()


def test_a_reward_that_fails_on_a_sample_gives_zero_and_a_warning(
        fakes: Path, caplog: pytest.LogCaptureFixture) -> None:
    task = fake("fake-picky", fakes)
    problem = task.train_problems()[0]
    try:
        with caplog.at_level(logging.WARNING, logger="hacfed.tasks.plugin"):
            boom = task.verify(problem, "boom ba")
            wrong_type = task.verify(problem, "str")
        assert boom.reward == 0.0 and boom.reason == f"{VERIFIER_ABORT}: plugin fake-picky: reward raised RuntimeError"
        assert wrong_type.reward == 0.0 and "reward returned str, not a float" in wrong_type.reason
        assert len([r for r in caplog.records if "fake-picky" in r.getMessage()]) == 1  # warned once
        assert task.verify(problem, "ba").reward == 1.0
    finally:
        task.close()


def test_a_reward_past_its_time_limit_is_aborted_and_the_next_sample_is_scored(fakes: Path) -> None:
    task = fake("fake-slow", fakes, sandbox={"timeout_s": 1.0})
    problem = task.train_problems()[0]
    try:
        slow = task.verify(problem, "sleep")
        assert slow.reward == 0.0 and slow.reason == f"{VERIFIER_ABORT}: timeout"
        assert task.verify(problem, "ba").reward == 1.0
    finally:
        task.close()


def test_the_plugin_has_no_network(fakes: Path) -> None:
    """The same reward reaches a loopback listener without the sandbox's network isolation, and not with it."""
    if network_isolation_prefix() is None:
        pytest.skip("`unshare -n` is unavailable here")
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    accepted: list[object] = []
    threading.Thread(target=lambda: accepted.append(listener.accept()), daemon=True).start()
    isolated, open_net = fake("fake-network", fakes), fake("fake-network", fakes, sandbox={"network": "off-unsafe"})
    try:
        problem = isolated.train_problems()[0]
        assert isolated.verify(problem, f"port {port}").reward == 0.0 and not accepted
        assert open_net.verify(problem, f"port {port}").reward == 1.0
    finally:
        isolated.close(), open_net.close(), listener.close()


@pytest.mark.parametrize(
    ("value", "error"),
    [(True, "reward returned bool, not a float"), (1, "reward returned int, not a float"),
     (float("nan"), "outside [0, 1]"), (-0.5, "outside [0, 1]"), (None, "reward returned NoneType")],
)
def test_reward_values_are_checked_in_the_worker(value: object, error: str) -> None:
    assert error in call_reward(lambda p, r: value, {}, "")["error"]
    assert call_reward(lambda p, r: 0.25, {}, "") == {"reward": 0.25}


def test_problems_are_checked_in_the_worker() -> None:
    class Plugin:
        @staticmethod
        def problems(split: str) -> list:
            return [{"question": "q", "answer": 3}, {"question": "r", "answer": None}]

    assert "item 1 needs an 'answer' string" in load_problems(Plugin, "train")["error"]
    assert load_problems(Plugin, "test")["error"] == "unknown split 'test'"


# ----------------------------------------------------------------------------- the coordinator re-verifies


def test_the_coordinator_rejects_a_reward_the_plugin_does_not_give(example: PluginTask, tmp_path: Path) -> None:
    cfg = make_config(tmp_path / "server", task=SPEC, group_size=2)
    coordinator = Coordinator(cfg, example, Journal(cfg.journal_path), clock=FakeClock())
    for pid in ("honest", "liar"):
        coordinator.register(pid)
    plan = coordinator.open_round(0)

    def submission(pid: str, lie: bool) -> Submission:
        out = []
        for prompt in plan.prompts:
            answer = example.problem(prompt.prompt_id).answer
            for i, text in enumerate((answer, "no idea")):
                reward = example.verify(example.problem(prompt.prompt_id), text).reward
                out.append(Trajectory(
                    trajectory_id=f"{pid}/{prompt.prompt_id}/{i}", prompt_id=prompt.prompt_id, source_id=pid,
                    policy_version=0, prompt=prompt.messages, response_text=text,
                    reward=1.0 - reward if lie else reward, source_logp_sum=-1.0, source_token_count=2,
                    finish_reason="stop"))
        return Submission(plan.run_id, pid, 0, tuple(out), None)

    honest = coordinator.submit(submission("honest", lie=False))
    assert honest.rejected == () and len(honest.accepted_ids) == 2 * 2
    liar = coordinator.submit(submission("liar", lie=True))
    assert liar.accepted_ids == () and {r.code for r in liar.rejected} == {ErrorCode.REWARD_MISMATCH}
    assert coordinator.journal.participant("liar").strikes >= 1


def test_a_nested_task_setting_can_be_overridden(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, task={**SPEC, "sandbox": {"timeout_s": 5}})
    changed = cfg.with_overrides({"task.sandbox.timeout_s": 9, "task.max_eval": 3})
    assert changed.task["sandbox"] == {"timeout_s": 9} and changed.task["max_eval"] == 3
    assert cfg.task["sandbox"] == {"timeout_s": 5}  # a copy
    with pytest.raises(ValueError, match=r"'plugin' is 'reverse-word', not a table"):
        cfg.with_overrides({"task.plugin.x": 1})
