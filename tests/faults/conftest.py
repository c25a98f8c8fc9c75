"""Shared by the fault suite (issue 9, security.md R1 R3 R4 R5): a real federation on loopback.

`federation(tmp_path)` gives a `Federation` of tests/federation.py: one hacfed-server (`--insecure` on a
free 127.0.0.1 port, the same after every restart) and hacfed-client labs with the cached tiny-llama
preset; `fault_toml` is its coordinator config. On teardown every process of every tree the fixture saw
must have exited (a killed hacfed-server's SuperLink and ServerApp included: the restarted server stops
them); what is left is named, then killed by pid, so nothing outlives the test either way.

Tiny rounds (2 prompts x G=2, 6 new tokens, 4 eval problems) keep each test to a minute or two on
2 busy CPU cores.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.federation import MODEL, Federation, coordinator_toml
from tests.processes import cli_env, running_descendants


def fault_toml(run_id: str, *, rounds: int, expected: int, minimum: int, deadline_s: float) -> str:
    """The fault suite's coordinator config: `expected` labs, quorum `minimum`, tiny rounds, one deadline
    extension, evaluation at the end only, a retry every second."""
    return coordinator_toml(run_id, rounds=rounds, expected_participants=expected, min_participants=minimum,
                            round_deadline_s=deadline_s, max_deadline_extensions=1, eval_every=0,
                            server={"retry_interval_s": 1.0})


_PASSED = pytest.StashKey[bool]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """Keep the call phase's report on the item: the fixture's teardown reads whether the test passed."""
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.stash[_PASSED] = report.passed


@pytest.fixture
def federation(tmp_path: Path, request: pytest.FixtureRequest,
               zoo_presets: Callable[..., None]) -> Iterator[Federation]:
    zoo_presets(MODEL)  # built before any lab starts: no lab's start-up includes a warm-up
    env = {**cli_env(), "OMP_NUM_THREADS": "1"}
    env.pop("HACFED_CRASH_AT", None)
    before = running_descendants()
    fed = Federation(tmp_path, env)
    try:
        yield fed
    finally:
        # A failed test leaves the processes its kills orphaned (a SuperNode without its client):
        # they are stopped all the same; only a test that passed must have left nothing behind.
        fed.teardown(before, strict=request.node.stash.get(_PASSED, False))
