"""A task plugin's side of the sandboxed worker (`hacfed.tasks.sandbox`): the only place its code runs.

`handler_for(value)` runs inside the worker process at start-up: it imports the object an entry
point of the group `hacfed.tasks` names ("module" or "module:attr", found by the parent in the
installed packages' metadata), so the plugin's imports (torch, say) happen there and never in the
coordinator's or a lab's own process; then it answers requests, one JSON object each:

  {"op": "describe"}
      -> {"prompt_template": str | None, "problems": bool (whether it provides problems(split))}
  {"op": "problems", "split": "train" | "eval"}
      -> {"problems": [{"question": str, "answer": str, "solution": str | None}, ...]}
  {"op": "reward", "problem": {...}, "response": str}
      -> {"reward": float in [0, 1]}

A plugin's failure is a reply, not a crash: {"error": "<what, fixed words>", "detail": "<its message>"}.
The parent (`hacfed.tasks.plugin`) puts `detail` in its one-line refusals at load time only, never
in a verdict (it may echo model text). Standard library only: the module is imported by the parent
too, for `GROUP` and `find_entry_point`, and must stay cheap and torch-free there.
"""

from __future__ import annotations

import functools
import math
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Callable

GROUP = "hacfed.tasks"
SPLITS = ("train", "eval")


def find_entry_point(name: str) -> EntryPoint:
    """The installed entry point `name` of the group, found in the packages' metadata without
    importing anything; ValueError naming the installed ones when there is none, or two."""
    found = list(entry_points(group=GROUP, name=name))
    if not found:
        installed = sorted({ep.name for ep in entry_points(group=GROUP)})
        raise ValueError(f"task plugin {name!r} is not installed: no entry point {name!r} in group {GROUP!r} "
                         f"(installed: {installed or 'none'}); install the task's package at this site")
    if len({ep.value for ep in found}) > 1:
        raise ValueError(f"task plugin {name!r} is provided by more than one installed package: "
                         f"{sorted(ep.value for ep in found)}")
    return found[0]


def reward_function(plugin: Any) -> Callable[[dict[str, Any], str], object]:
    """The plugin's reward: its `reward` attribute, or the entry point's object itself if it is a function."""
    reward = getattr(plugin, "reward", None)
    if callable(reward):
        return reward
    if callable(plugin) and not isinstance(plugin, type):
        return plugin
    raise TypeError(f"{plugin!r} has no reward(problem, response) function")


def handler_for(value: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The worker's request handler for the plugin object at `value` ("module" or "module:attr",
    the entry point's value, which the parent found in the metadata); called once, by the worker,
    at start-up."""
    plugin = EntryPoint(name="plugin", value=value, group=GROUP).load()
    return functools.partial(handle, plugin, reward_function(plugin))


def handle(plugin: Any, reward: Callable[[dict[str, Any], str], object], request: dict[str, Any]) -> dict[str, Any]:
    op = request.get("op")
    if op == "reward":
        return call_reward(reward, request["problem"], request["response"])
    if op == "describe":
        template = getattr(plugin, "prompt_template", None)
        if template is not None and not isinstance(template, str):
            return {
                "error": f"prompt_template is {type(template).__name__}, not a string", "detail": repr(template)[:80]
            }
        return {"prompt_template": template, "problems": callable(getattr(plugin, "problems", None))}
    if op == "problems":
        return load_problems(plugin, request["split"])
    return {"error": f"unknown request {op!r}", "detail": ""}


def call_reward(
    reward: Callable[[dict[str, Any], str], object], problem: dict[str, Any], response: str
) -> dict[str, Any]:
    try:
        value = reward(problem, response)
    except Exception as e:  # the plugin's own failure: a reply naming it (the sandbox boundary)
        return {"error": f"reward raised {type(e).__name__}", "detail": str(e)[:200]}
    if isinstance(value, bool) or not isinstance(value, float):
        return {"error": f"reward returned {type(value).__name__}, not a float", "detail": repr(value)[:80]}
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        return {"error": "reward returned a value outside [0, 1]", "detail": repr(value)[:80]}
    return {"reward": float(value)}


def load_problems(plugin: Any, split: str) -> dict[str, Any]:
    if split not in SPLITS:
        return {"error": f"unknown split {split!r}", "detail": ""}
    try:
        items = list(plugin.problems(split))
    except Exception as e:  # the plugin's own failure, named in the parent's one-line refusal
        return {"error": f"problems({split!r}) raised {type(e).__name__}", "detail": str(e)[:200]}
    out = []
    for index, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("question"), str):
            return {"error": f"problems({split!r}) item {index} is not a dict with a 'question' string",
                    "detail": repr(item)[:80]}
        answer, solution = item.get("answer"), item.get("solution")
        if isinstance(answer, (int, float)) and not isinstance(answer, bool):
            answer = str(answer)
        if not isinstance(answer, str) or (solution is not None and not isinstance(solution, str)):
            return {"error": f"problems({split!r}) item {index} needs an 'answer' string (and 'solution', if "
                             f"given, a string)", "detail": repr(item)[:80]}
        out.append({"question": item["question"], "answer": answer, "solution": solution})
    return {"problems": out}
