"""Build a Task from a plain config mapping (a TOML table or the coordinator's run config).

Torch-free on purpose: the coordinator builds its task here and must never import torch
(docs/design.md). `datasets` is imported only when a data-file task actually reads its files.

    load_task({"kind": "arithmetic", "digits": 2, "operators": "+", "seed": 0})
    load_task({"kind": "arithmetic", "style": "words"})   # "What is 37 + 58? Reply with only the number."
    load_task({"kind": "story"})   # "Tom has 19 apples and buys 20 more. How many ... End with 'Answer: N'."
    load_task({"kind": "jsonl", "name": "gsm8k", "train_files": ["gsm8k/train.jsonl"],
               "eval_files": ["gsm8k/test.jsonl"], "answer_format": "gsm8k",
               "verifier": {"answer_mode": "boxed", "sandbox": {"timeout_s": 5}}}, base_dir="configs/")
    load_task({"kind": "gsm8k", "max_train": 1000})   # the shipped GSM8K (hacfed.tasks.math_data.gsm8k_task)
    load_task({"kind": "plugin", "plugin": "reverse-word", "train_files": "train.jsonl",
               "eval_files": "eval.jsonl"})   # an installed task package's reward (hacfed.tasks.plugin)

Unknown kinds and unknown keys are ValueErrors naming them, so a typo never silently falls back to
a default. Data-file tasks are loaded eagerly here so bad files fail at config load.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping

from hacfed.tasks.arithmetic import WORDS_MAX_NEW_TOKENS, ArithmeticTask
from hacfed.tasks.base import Task
from hacfed.tasks.chain import ChainTask
from hacfed.tasks.math_data import GSM8K_MAX_NEW_TOKENS, MathDataTask, gsm8k_task
from hacfed.tasks.math_verifier import MathVerifierConfig
from hacfed.tasks.plugin import PluginTaskConfig, load_plugin_task
from hacfed.tasks.sandbox import SandboxLimits
from hacfed.tasks.story import STORY_MAX_NEW_TOKENS, StoryTask

TASK_KINDS = ("arithmetic", "chain", "story", "jsonl", "parquet", "plugin", "gsm8k")


def load_task(spec: Mapping[str, object], base_dir: str | Path | None = None) -> Task:
    """The task described by `spec`; relative data paths are resolved against `base_dir` when given."""
    if not isinstance(spec, Mapping):
        raise ValueError(f"task spec must be a mapping, got {type(spec).__name__}")
    kind = spec.get("kind")
    if kind not in TASK_KINDS:
        raise ValueError(f"task spec: unknown kind {kind!r}; expected one of {TASK_KINDS}")
    options = {k: v for k, v in spec.items() if k != "kind"}
    if kind == "arithmetic":
        _check_keys("arithmetic task", options, _field_names(ArithmeticTask))
        _check_types("arithmetic task", options, {"digits": int, "seed": int, "num_train": int, "num_eval": int,
                                                     "num_validation": int, "operators": str, "style": str,
                                                     "solution_form": str})
        return ArithmeticTask(**options)  # type: ignore[arg-type]
    if kind == "chain":
        _check_keys("chain task", options, _field_names(ChainTask))
        _check_types("chain task", options, {"terms": int, "seed": int, "num_train": int,
                                             "num_validation": int, "num_eval": int, "other_train": int})
        for key in ("operations", "notations"):
            if key in options:
                values = options[key]
                is_list = isinstance(values, (list, tuple)) and not isinstance(values, str)
                if not is_list or not all(isinstance(v, str) for v in values):
                    raise ValueError(f"chain task: {key!r} must be a list of strings, got {values!r}")
                options[key] = tuple(values)
        return ChainTask(**options)  # type: ignore[arg-type]
    if kind == "story":
        _check_keys("story task", options, _field_names(StoryTask))
        _check_types("story task", options, {"seed": int, "num_train": int, "num_validation": int, "num_eval": int})
        return StoryTask(**options)  # type: ignore[arg-type]
    if kind == "gsm8k":  # the GSM8K copy that ships with hacfed (hacfed.tasks.math_data.gsm8k_task)
        if "verifier" in options:
            options["verifier"] = _verifier_config(options["verifier"])
        task = gsm8k_task(**options)
        task.train_problems()  # read and validate the files now, not at the first round
        return task
    if kind == "plugin":  # a lab's own reward from an installed package (hacfed.tasks.plugin)
        return load_plugin_task(PluginTaskConfig.from_spec(options, base_dir))
    return _load_math_data(kind, options, base_dir)


def task_sampling_defaults(spec: object) -> dict[str, object]:
    """The sampling a task spec asks for when `[sampling]` does not say (SamplingParams fields), read
    from the spec alone without loading data: the built-in gsm8k task's budget (its `max_new_tokens`
    option, else GSM8K_MAX_NEW_TOKENS), a data-file task's `max_new_tokens` when given, the words-style
    arithmetic task's budget, the story task's. Empty for everything else and for a malformed spec
    (load_task judges it)."""
    if not isinstance(spec, Mapping):
        return {}
    kind, budget = spec.get("kind"), spec.get("max_new_tokens")
    if kind == "gsm8k":
        return {"max_new_tokens": GSM8K_MAX_NEW_TOKENS if budget is None else budget}
    if kind in ("jsonl", "parquet") and budget is not None:
        return {"max_new_tokens": budget}
    if kind == "arithmetic" and spec.get("style") == "words":
        return {"max_new_tokens": WORDS_MAX_NEW_TOKENS}
    if kind == "story":
        return {"max_new_tokens": STORY_MAX_NEW_TOKENS}
    return {}


def _load_math_data(kind: str, options: dict[str, Any], base_dir: str | Path | None) -> MathDataTask:
    allowed = _field_names(MathDataTask) - {"data_format"}
    _check_keys(f"{kind} task", options, allowed)
    _check_types(f"{kind} task", options, {"name": str, "question_field": str, "answer_field": str,
                                           "answer_format": str, "prompt_template": str})
    for split in ("train_files", "eval_files"):
        if split not in options:
            raise ValueError(f"{kind} task: {split!r} is required")
        options[split] = _paths(f"{kind} task {split}", options[split], base_dir)
    if "cache_dir" in options and options["cache_dir"] is not None:
        options["cache_dir"] = str(options["cache_dir"])
    if "verifier" in options:
        options["verifier"] = _verifier_config(options["verifier"])
    task = MathDataTask(data_format=kind, **options)  # type: ignore[arg-type]
    task.train_problems()  # read and validate every file now, not at the first round
    return task


def _verifier_config(spec: object) -> MathVerifierConfig:
    if not isinstance(spec, Mapping):
        raise ValueError(f"task spec 'verifier' must be a mapping, got {spec!r}")
    options = dict(spec)
    _check_keys("task spec 'verifier'", options, _field_names(MathVerifierConfig))
    if "sandbox" in options:
        sandbox = options["sandbox"]
        if not isinstance(sandbox, Mapping):
            raise ValueError(f"task spec 'verifier.sandbox' must be a mapping, got {sandbox!r}")
        _check_keys("task spec 'verifier.sandbox'", sandbox, _field_names(SandboxLimits))
        options["sandbox"] = SandboxLimits(**sandbox)
    return MathVerifierConfig(**options)


def _paths(what: str, value: object, base_dir: str | Path | None) -> tuple[str, ...]:
    items = [value] if isinstance(value, (str, Path)) else value
    if not isinstance(items, (list, tuple)) or not items or not all(isinstance(p, (str, Path)) for p in items):
        raise ValueError(f"{what} must be a path or a non-empty list of paths, got {value!r}")
    base = Path(base_dir) if base_dir is not None else None
    return tuple(str(base / p) if base is not None and not Path(p).is_absolute() else str(p) for p in items)


def _field_names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _check_keys(what: str, options: Mapping[str, object], allowed: set[str]) -> None:
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ValueError(f"{what}: unknown key(s) {unknown}; allowed: {sorted(allowed)}")


def _check_types(what: str, options: Mapping[str, object], types: Mapping[str, type]) -> None:
    for key, expected in types.items():
        if key in options:
            value = options[key]
            if isinstance(value, bool) or not isinstance(value, expected):
                raise ValueError(f"{what}: {key!r} must be {expected.__name__}, got {value!r}")
