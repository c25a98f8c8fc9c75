"""Session-wide test settings.

Every test, and every Python process it starts, is confined to the clone
(tests/confine/hacfed_confine.py): a test that reads a sibling directory, the home directory or any other
file a fresh clone does not have fails, naming the path. HACFED_TEST_CONFINE=0 switches it off.

Third-party caches stay out of the home directory too: matplotlib (the demo's plot) keeps its font
cache in $HACFED_HOME/matplotlib, or in a temporary directory of the session.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from tests.confine import hacfed_confine
from tests.confine.hacfed_confine import (  # noqa: F401 - pytest hooks
    pytest_runtest_teardown,
    pytest_sessionfinish,
    pytest_terminal_summary,
)

_made: list[str] = []


def pytest_configure(config) -> None:  # noqa: ANN001 - pytest.Config
    home = os.environ.get("HACFED_HOME")
    if home:
        os.environ["MPLCONFIGDIR"] = os.path.join(home, "matplotlib")
    else:
        _made.append(tempfile.mkdtemp(prefix="hacfed-mpl-"))
        os.environ["MPLCONFIGDIR"] = _made[-1]
    hacfed_confine.pytest_configure(config)


def pytest_unconfigure(config) -> None:  # noqa: ANN001
    hacfed_confine.pytest_unconfigure(config)
    for path in _made:
        shutil.rmtree(path, ignore_errors=True)
