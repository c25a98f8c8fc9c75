"""Session-wide test settings.

Every test, and every Python process it starts, is confined to the clone
(tests/confine/hacfed_confine.py): a test that reads a sibling directory, the home directory or any other
file a fresh clone does not have fails, naming the path. HACFED_TEST_CONFINE=0 switches it off.

Built zoo models are cached once per clone: HACFED_HOME defaults to `.hacfed-home` in the clone (as
scripts/test.sh sets it), so a plain `pytest` run, the tests' own processes and later runs all find
what an earlier test built. The `zoo_presets` fixture builds the presets a test needs before the test
starts (a preset is built at most once, by whichever test needs it first; later calls return at once).

Third-party caches stay out of the home directory too: matplotlib (the demo's plot) keeps its font
cache in $HACFED_HOME/matplotlib, and `datasets` (a task's data files read without a `cache_dir`) its
cache in $HACFED_HOME/hf-datasets; the tests' own processes inherit both.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from hacfed.procs import ProcessSupervisor
from tests.confine import hacfed_confine
from tests.confine.hacfed_confine import pytest_runtest_teardown, pytest_sessionfinish, pytest_terminal_summary  # noqa: F401 - pytest hooks

REPO = Path(__file__).resolve().parents[1]
BUILD_TIMEOUT_S = 3600.0  # two chain-* presets take about 6 minutes on 2 idle cores


def pytest_configure(config) -> None:  # noqa: ANN001 - pytest.Config
    home = os.environ.setdefault("HACFED_HOME", str(REPO / ".hacfed-home"))
    os.environ["MPLCONFIGDIR"] = os.path.join(home, "matplotlib")
    os.environ.setdefault("HF_DATASETS_CACHE", os.path.join(home, "hf-datasets"))
    hacfed_confine.pytest_configure(config)


def pytest_unconfigure(config) -> None:  # noqa: ANN001
    hacfed_confine.pytest_unconfigure(config)


def pytest_collection_modifyitems(config, items: list[pytest.Item]) -> None:  # noqa: ANN001
    """Test files that hold a `slow` test run first, each file's tests in their own order.

    The workers (scripts/test.sh: `--dist loadfile --no-loadscope-reorder`) take files in this order,
    so the minutes-long files start early and the many short unit files fill the end, instead of two
    workers finishing minutes apart on the last long files (xdist's default puts the files with the most
    tests first, which are short unit files, and leaves the one-test integration files for the end).
    """
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: the collected order otherwise


@pytest.fixture(scope="session")
def zoo_presets(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., None]:
    """`zoo_presets("tiny-llama", ...)`: each preset built and cached under HACFED_HOME, two at a time.

    A cached preset whose recipe is current is used as it is (checked here, which imports torch).
    Each build is `hacfed models build NAME` in its own process group with one torch thread (what a
    lab does on first use), stopped by pid if the test run ends first.
    """
    from hacfed.models import store, zoo

    logs = tmp_path_factory.mktemp("zoo-builds")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ready: set[str] = set()

    def current(name: str) -> bool:
        return store.is_current(store.model_dir(name), store.recipe_hash(zoo.preset_recipe(name, 0)))

    def build(*names: str) -> None:
        todo = [name for name in dict.fromkeys(names) if name not in ready and not current(name)]
        with ProcessSupervisor() as sup:
            for pair in (todo[i:i + 2] for i in range(0, len(todo), 2)):  # one build per core
                procs = [sup.start([sys.executable, "-m", "hacfed.tools.cli", "models", "build", name], env=env,
                                   log_path=logs / f"{name}.log", name=f"build-{name}") for name in pair]
                for proc in procs:
                    code = proc.wait(timeout=BUILD_TIMEOUT_S)
                    assert code == 0, f"{proc.name} exited {code}:\n{proc.log_tail()}"
        ready.update(names)

    return build
