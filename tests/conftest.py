"""Session-wide: every test, and every Python process it starts, is confined to the clone
(tests/confine/hacfed_confine.py): a test that reads `../shared`, the home directory or any other
file a fresh clone does not have fails, naming the path. HACFED_TEST_CONFINE=0 switches it off."""

from tests.confine.hacfed_confine import (  # noqa: F401 - pytest hooks
    pytest_configure,
    pytest_runtest_teardown,
    pytest_sessionfinish,
    pytest_terminal_summary,
    pytest_unconfigure,
)
