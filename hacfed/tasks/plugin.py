"""A lab's own task: a reward function (and, if it likes, the problems) from an installed package.

The coordinator's `[task]` (and each lab's, the same table):

    [task]
    kind = "plugin"
    plugin = "reverse-word"              # an entry point of the group "hacfed.tasks"
    train_files = ["data/train.jsonl"]   # JSONL, JSON, Parquet, CSV, Arrow or a save_to_disk
    eval_files = ["data/eval.jsonl"]     #   directory (hacfed.tasks.records); relative to the config
    question_field = "question"          # default "question"
    answer_field = "answer"              # default "answer"
    num_validation = 100                 # the last 100 train problems: the validation split (default 0)
    # name = "reverse-word"  prompt_template = "{question}"  system_prompt = "..."
    # max_train = 1000  max_eval = 100  cache_dir = "..."
    [task.sandbox]                       # hacfed.tasks.sandbox.SandboxLimits of the plugin's worker
    timeout_s = 5

The protocol a task package follows. Its pyproject.toml declares the entry point:

    [project.entry-points."hacfed.tasks"]
    reverse-word = "hacfed_task_example"   # a module (or any object) with the attributes below,
                                           # or "pkg.module:function" naming the reward itself

  reward(problem: dict, response: str) -> float   required. A float in [0, 1], deterministic: the
      coordinator calls it again on every sample and refuses a lab's claim that differs by > 1e-6.
      problem = {"prompt_id", "question", "answer", "prompt"} (all strings; "prompt" is the user
      message the model saw). A structured answer travels as text (JSON, say) the plugin parses.
  problems(split: str) -> list[dict]              optional, split "train" or "eval"; used when the
      [task] names no files. Each item {"question": str, "answer": str, "solution": str (optional)};
      the same list on every call and at every site.
  prompt_template: str                            optional; the user message, "{question}" replaced
      by the question. The [task]'s prompt_template wins; default "{question}".

Problems are identified as `<name>:<sha256(question)[:16]>` (name: the [task]'s `name`, else the
plugin's); a question repeated in a split keeps its first record, and a train question that is
also in the eval split is dropped from train. A problem's reference `solution` (supervised warm-up)
is its "solution", else its answer.

The validation split, for choosing a lab's settings without looking at the eval (test) problems:
with `num_validation = N`, the last N train problems (after the above) are set aside. Nothing trains
on them and no round plan draws them; a lab scores on them with `eval_split = "validation"`
(hacfed-client's participant config, or `hacfed sim --eval-split validation`). Every site must use
the same N (it is part of the [task], which the coordinator checks).

Where the plugin runs: only in a sandboxed worker (hacfed.tasks.sandbox: its own process with time
and memory limits and no network; hacfed.tasks.plugin_worker is its side), at the coordinator,
which re-verifies every claimed reward with it, and at each lab, which scores its own samples with
it. Neither process imports the plugin (this module reads only the entry point's metadata), so the
coordinator stays torch-free whatever the plugin imports. No code travels: every site installs the
task's package itself (`pip install ...`), every site the same version: a reward that differs
between the coordinator and a lab turns the lab's honest claims into mismatches (strikes), a prompt
that differs into HACFED-E-TASK-MISMATCH. A plugin with heavy imports may need more of the
worker's address space ([task.sandbox] memory_bytes, 1.5 GiB by default) or start-up time
(startup_timeout_s). The worker answers one sample at a time.

Refused at load, each with one line naming the plugin: a plugin that is not installed (the
installed ones are named) or installed twice, that fails to import or has no reward function, a
reward that raises or returns a non-float or a value outside [0, 1] on the first train problem
(called with its solution and with an empty response), malformed problems(). Later, a reward that
fails on a sample (raises, times out, bad value) gives that sample 0 with a HACFED-E-VERIFIER-ABORT
reason, at both ends alike, and a warning the first time.

    task = load_task({"kind": "plugin", "plugin": "reverse-word", "train_files": "train.jsonl",
                      "eval_files": "eval.jsonl"})
    task.verify(task.train_problems()[0], "... elppa").reward   # 1.0: the first word is "apple"
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from hacfed.tasks.base import Problem, SplitLookup, Verdict
from hacfed.tasks.math_data import question_hash
from hacfed.tasks.plugin_worker import find_entry_point
from hacfed.tasks.records import read_fields
from hacfed.tasks.sandbox import VERIFIER_ABORT, SandboxAbort, SandboxedWorker, SandboxLimits, SandboxStartError
from hacfed.trajectory import ChatMessage

WORKER_FACTORY = "hacfed.tasks.plugin_worker:handler_for"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_PROBLEMS_REPLY_BYTES = 256 << 20  # what problems(split) may return through the loader's pipe
_PROBLEMS_TIMEOUT_S = 120.0
_log = logging.getLogger(__name__)
Item = tuple[str, str, "str | None"]  # one problem as read: question, answer, solution
Splits = tuple[tuple[Problem, ...], tuple[Problem, ...], tuple[Problem, ...]]  # train, validation, eval


@dataclass(frozen=True)
class PluginTaskConfig:
    """The `[task]` table of kind "plugin" (module docstring), validated here."""

    plugin: str
    name: str | None = None
    train_files: tuple[str, ...] = ()
    eval_files: tuple[str, ...] = ()
    question_field: str = "question"
    answer_field: str = "answer"
    prompt_template: str | None = None
    system_prompt: str | None = None
    max_train: int | None = None
    max_eval: int | None = None
    num_validation: int = 0  # the last N train problems become the validation split (module docstring)
    cache_dir: str | None = None
    sandbox: SandboxLimits = field(default_factory=SandboxLimits)

    def __post_init__(self) -> None:
        for key in ("plugin", "name"):
            value = getattr(self, key)
            if (key == "plugin" or value is not None) and (not isinstance(value, str) or not _NAME.fullmatch(value)):
                raise ValueError(f"plugin task: {key!r} must match {_NAME.pattern}, got {value!r}")
        if bool(self.train_files) != bool(self.eval_files):
            raise ValueError("plugin task: give both 'train_files' and 'eval_files', or neither (then the plugin's "
                             "problems(split) provides them)")
        for key in ("question_field", "answer_field"):
            if not isinstance(getattr(self, key), str) or not getattr(self, key):
                raise ValueError(f"plugin task: {key!r} must be a non-empty string, got {getattr(self, key)!r}")
        for key in ("prompt_template", "system_prompt", "cache_dir"):
            if getattr(self, key) is not None and not isinstance(getattr(self, key), str):
                raise ValueError(f"plugin task: {key!r} must be a string, got {getattr(self, key)!r}")
        if self.prompt_template is not None:
            _check_template(self.prompt_template, "the [task]'s prompt_template")
        for key in ("max_train", "max_eval"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"plugin task: {key!r} must be an integer >= 1, got {value!r}")
        if isinstance(self.num_validation, bool) or not isinstance(self.num_validation, int) \
                or self.num_validation < 0:
            raise ValueError(f"plugin task: 'num_validation' must be an integer >= 0, got {self.num_validation!r}")
        if not isinstance(self.sandbox, SandboxLimits):
            raise ValueError(f"plugin task: 'sandbox' must be a SandboxLimits, got {self.sandbox!r}")

    @property
    def task_name(self) -> str:
        return self.name if self.name is not None else self.plugin

    @classmethod
    def from_spec(cls, options: Mapping[str, object], base_dir: str | Path | None = None) -> "PluginTaskConfig":
        """From the [task] table without its `kind`; relative data paths resolve against `base_dir`."""
        allowed = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - allowed)
        if unknown:
            raise ValueError(f"plugin task: unknown key(s) {unknown}; allowed: {sorted(allowed)}")
        if "plugin" not in options:
            raise ValueError("plugin task: 'plugin' is required (the name of an installed task plugin)")
        kwargs = dict(options)
        for key in ("train_files", "eval_files"):
            if key in kwargs:
                kwargs[key] = _paths(key, kwargs[key], base_dir)
        if "sandbox" in kwargs:
            kwargs["sandbox"] = _sandbox_limits(kwargs["sandbox"])
        return cls(**kwargs)  # type: ignore[arg-type]


class PluginTask(SplitLookup):
    """A verifiable task whose reward is a plugin's, called in its sandboxed worker. Built by
    `load_plugin_task`, which has checked the plugin and read the problems."""

    def __init__(self, config: PluginTaskConfig, worker: SandboxedWorker, splits: "Splits",
                 questions: Mapping[str, str]) -> None:
        self.name = config.task_name
        self.config = config
        self._worker = worker
        train, self._validation, held_out = splits
        self._splits = (train, held_out)
        self._questions = dict(questions)
        self._warned = False

    def validation_problems(self) -> tuple[Problem, ...]:
        """The last `num_validation` train problems, never trained on (empty when 0)."""
        return self._validation

    def verify(self, problem: Problem, response: str) -> Verdict:
        if not isinstance(response, str):
            return Verdict(0.0, "response is not text")
        try:
            reply = self._worker.call(reward_request(problem, self._questions[problem.prompt_id], response))
        except SandboxAbort as e:
            return Verdict(0.0, f"{VERIFIER_ABORT}: {e.reason}")
        reward = reply.get("reward")
        if type(reward) is float and 0.0 <= reward <= 1.0:
            return Verdict(reward, f"plugin {self.config.plugin}")
        error = str(reply.get("error", "malformed reply"))[:100]
        if not self._warned:
            self._warned = True
            _log.warning("task plugin %r: %s (%s); such samples get reward 0", self.config.plugin, error,
                         str(reply.get("detail", ""))[:80])
        return Verdict(0.0, f"{VERIFIER_ABORT}: plugin {self.config.plugin}: {error}")

    def close(self) -> None:
        """Stop the plugin's worker process (it is also stopped at interpreter exit)."""
        self._worker.close()


def reward_request(problem: Problem, question: str, response: str) -> dict[str, Any]:
    prompt = problem.messages[-1].content
    return {"op": "reward", "response": response,
            "problem": {
                "prompt_id": problem.prompt_id, "question": question, "answer": problem.answer, "prompt": prompt,
            }}


def load_plugin_task(config: PluginTaskConfig) -> PluginTask:
    """The plugin task of `config`, checked end to end (module docstring: what is refused)."""
    plugin = config.plugin
    entry = find_entry_point(plugin)
    files = [_records(config, config.train_files), _records(config, config.eval_files)] if config.train_files else None
    worker = SandboxedWorker(WORKER_FACTORY, config.sandbox, argument=entry.value)
    try:
        described = _ask(worker, {"op": "describe"}, plugin, f"failed to load ({entry.value})")
        template = next((t for t in (config.prompt_template, described.get("prompt_template")) if t is not None),
                        "{question}")
        _check_template(template, f"task plugin {plugin!r}: its prompt_template")
        if files is not None:
            items = files
        elif described.get("problems"):
            items = _plugin_problems(config, entry.value)
        else:
            raise ValueError(f"task plugin {plugin!r} provides no problems(split): give the [task] 'train_files' "
                             f"and 'eval_files'")
        splits, questions = _splits(config, template, items)
        _probe(worker, plugin, splits[0][0], questions)
    except BaseException:
        worker.close()
        raise
    return PluginTask(config, worker, splits, questions)



def _records(config: PluginTaskConfig, files: tuple[str, ...]) -> list[Item]:
    out: list[Item] = []
    for path in files:
        questions, answers = read_fields(path, (config.question_field, config.answer_field), config.cache_dir)
        for index, (question, answer) in enumerate(zip(questions, answers), start=1):
            where = f"{path}, record {index}"
            if not isinstance(question, str) or not question.strip():
                raise ValueError(
                    f"{where}: field {config.question_field!r} must be non-empty text, got {question!r:.80}"
                )
            out.append((question.strip(), _answer_text(answer, where, config.answer_field), None))
    return out


def _answer_text(value: object, where: str, field_name: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return repr(value)
    raise ValueError(f"{where}: field {field_name!r} must be text or a number, got {value!r:.80}")


def _plugin_problems(config: PluginTaskConfig, value: str) -> list[list[Item]]:
    """problems("train") and problems("eval"), from a worker of its own that may answer at length."""
    limits = dataclasses.replace(
        config.sandbox, timeout_s=max(config.sandbox.timeout_s, _PROBLEMS_TIMEOUT_S), cpu_s_per_item=None,
        cpu_s_lifetime=max(config.sandbox.cpu_s_lifetime, 4 * (math.ceil(_PROBLEMS_TIMEOUT_S) + 1)),
        max_reply_bytes=_PROBLEMS_REPLY_BYTES)
    with SandboxedWorker(WORKER_FACTORY, limits, argument=value) as loader:
        out = []
        for split in ("train", "eval"):
            reply = _ask(loader, {"op": "problems", "split": split}, config.plugin, f"problems({split!r}) failed")
            problems = reply.get("problems")
            if not isinstance(problems, list) or not problems:
                raise ValueError(f"task plugin {config.plugin!r}: problems({split!r}) gave no problems")
            out.append([(p["question"].strip(), p["answer"], p["solution"]) for p in problems])
        return out


def _splits(config: PluginTaskConfig, template: str, items: list[list[Item]]) -> tuple[Splits, dict[str, str]]:
    questions: dict[str, str] = {}
    train_all, eval_all = (_problems(config, template, split, questions) for split in items)
    eval_ids = {p.prompt_id for p in eval_all}
    train = [p for p in train_all if p.prompt_id not in eval_ids]
    if not train:
        raise ValueError(f"plugin task {config.task_name}: no train problems left after removing eval questions")
    if len(train) <= config.num_validation:
        raise ValueError(f"plugin task {config.task_name}: {len(train)} train problems left after removing eval "
                         f"questions, not more than num_validation {config.num_validation}")
    if not eval_all:
        raise ValueError(f"plugin task {config.task_name}: the eval split has no problems")
    cut = len(train) - config.num_validation
    return (tuple(train[:cut][: config.max_train]), tuple(train[cut:]), tuple(eval_all[: config.max_eval])), questions


def _problems(
    config: PluginTaskConfig, template: str, items: Iterable[Item], questions: dict[str, str]
) -> list[Problem]:
    """One Problem per distinct question (the first wins); `questions` learns each id's question."""
    out: list[Problem] = []
    seen: set[str] = set()
    for question, answer, solution in items:
        if not question:
            raise ValueError(f"plugin task {config.task_name}: a problem has an empty question")
        prompt_id = f"{config.task_name}:{question_hash(question)}"
        if prompt_id in seen:
            continue
        seen.add(prompt_id)
        messages = (ChatMessage("user", template.replace("{question}", question)),)
        if config.system_prompt is not None:
            messages = (ChatMessage("system", config.system_prompt), *messages)
        questions[prompt_id] = question
        out.append(Problem(prompt_id, messages, answer, solution if solution is not None else answer))
    return out


def _probe(worker: SandboxedWorker, plugin: str, problem: Problem, questions: Mapping[str, str]) -> None:
    """Refuse a reward that fails on the first train problem, with its solution and with nothing."""
    for response in (problem.solution, ""):
        reply = _ask(worker, reward_request(problem, questions[problem.prompt_id], response), plugin,
                     "reward failed on the first train problem")
        if "reward" not in reply:
            raise ValueError(f"task plugin {plugin!r}: malformed reward reply {reply!r:.80}")


def _ask(worker: SandboxedWorker, request: dict[str, Any], plugin: str, what: str) -> dict[str, Any]:
    """One load-time request; any failure is a ValueError of one line naming the plugin."""
    try:
        reply = worker.call(request)
    except SandboxStartError as e:
        raise ValueError(f"task plugin {plugin!r} {what}: {str(e).split('failed to start: ', 1)[-1]}") from None
    except SandboxAbort as e:
        raise ValueError(f"task plugin {plugin!r} {what} in its sandbox: {e.reason}") from None
    if "error" in reply:
        detail = f" ({reply['detail']})" if reply.get("detail") else ""
        raise ValueError(f"task plugin {plugin!r} {what}: {reply['error']}{detail}")
    return reply


def _check_template(template: str, what: str) -> None:
    if "{question}" not in template:
        raise ValueError(f"{what} must contain '{{question}}', got {template!r}")


def _paths(key: str, value: object, base_dir: str | Path | None) -> tuple[str, ...]:
    items = [value] if isinstance(value, (str, Path)) else value
    if (
        not isinstance(items, (list, tuple)) or not items
        or not all(isinstance(p, (str, Path)) and str(p) for p in items)
    ):
        raise ValueError(f"plugin task: {key!r} must be a path or a non-empty list of paths, got {value!r}")
    base = Path(base_dir) if base_dir is not None else None
    return tuple(str(base / p) if base is not None and not Path(p).is_absolute() else str(p) for p in items)


def _sandbox_limits(table: object) -> SandboxLimits:
    if isinstance(table, SandboxLimits):
        return table
    if not isinstance(table, Mapping):
        raise ValueError(f"plugin task: 'sandbox' must be a table, got {table!r}")
    allowed = {f.name for f in dataclasses.fields(SandboxLimits)}
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ValueError(f"plugin task: unknown key(s) {unknown} in 'sandbox'; allowed: {sorted(allowed)}")
    return SandboxLimits(**table)
