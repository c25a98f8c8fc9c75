"""Task plugins that misbehave, for tests/unit/test_task_plugin.py.

They are real entry points: `install_fakes(dir)` writes a distribution's metadata (a dist-info
folder with entry_points.txt) into `dir`, which the test puts on sys.path, so hacfed's lookup finds
them through importlib.metadata as it finds any installed task package. The sandboxed worker then
imports `tests.plugin_fakes:<attr>` (the repository root is on its path).
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

GOOD_DATA = [{"question": "ab", "answer": "ba"}, {"question": "cd", "answer": "dc"}]
EVAL_DATA = [{"question": "xy", "answer": "yx"}]

# entry point name -> object in this module
FAKES = {
    "fake-import-error": "tests.plugin_fakes_missing_module",
    "fake-no-reward": "tests.plugin_fakes:NoReward",
    "fake-int": "tests.plugin_fakes:returns_int",
    "fake-range": "tests.plugin_fakes:returns_two",
    "fake-raises": "tests.plugin_fakes:raises_always",
    "fake-picky": "tests.plugin_fakes:Picky",
    "fake-slow": "tests.plugin_fakes:Slow",
    "fake-network": "tests.plugin_fakes:Network",
    "fake-bad-problems": "tests.plugin_fakes:BadProblems",
    "fake-no-problems": "tests.plugin_fakes:exact",
    "fake-provides": "tests.plugin_fakes:Provides",
    "fake-empty-split": "tests.plugin_fakes:EmptyEval",
}


def install_fakes(directory: Path, name: str = "hacfed-fake-plugins", fakes: dict[str, str] = FAKES) -> None:
    info = directory / f"{name.replace('-', '_')}-0.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.0\n")
    lines = "".join(f"{ep} = {value}\n" for ep, value in fakes.items())
    (info / "entry_points.txt").write_text(f"[hacfed.tasks]\n{lines}")


def exact(problem: dict, response: str) -> float:
    """A plain function as the entry point: it is the reward."""
    return 1.0 if response.strip() == problem["answer"] else 0.0


class NoReward:
    prompt_template = "{question}"


def returns_int(problem: dict, response: str) -> int:
    return 1


def returns_two(problem: dict, response: str) -> float:
    return 2.0


def raises_always(problem: dict, response: str) -> float:
    raise KeyError("no such field")


class Picky:
    """Fine on the load-time probe, fails on a response that says "boom", returns a string on "str"."""

    @staticmethod
    def reward(problem: dict, response: str) -> float:
        if "boom" in response:
            raise RuntimeError("boom")
        if "str" in response:
            return "1.0"  # type: ignore[return-value]
        return exact(problem, response)


class Slow:
    @staticmethod
    def reward(problem: dict, response: str) -> float:
        if response == "sleep":
            time.sleep(60)
        return exact(problem, response)


class Network:
    """1.0 when it could open a TCP connection to the port in the response (the sandbox has no network)."""

    @staticmethod
    def reward(problem: dict, response: str) -> float:
        if not response.startswith("port "):
            return 0.0
        try:
            with socket.create_connection(("127.0.0.1", int(response[5:])), timeout=2):
                return 1.0
        except OSError:
            return 0.0


class BadProblems:
    reward = staticmethod(exact)

    @staticmethod
    def problems(split: str) -> list:
        return [{"question": 3}]


class EmptyEval:
    reward = staticmethod(exact)

    @staticmethod
    def problems(split: str) -> list:
        return GOOD_DATA if split == "train" else []


class Provides:
    reward = staticmethod(exact)
    prompt_template = "Q: {question}"

    @staticmethod
    def problems(split: str) -> list:
        return GOOD_DATA if split == "train" else EVAL_DATA
