"""The coordinator's console: the lines hacfed-server prints for the operator.

Runs in the coordinator's ServerApp process: the round driver (`hacfed.server.driver`) and its
collaborators write every line through one `ConsoleLog`; hacfed-server tails the file
(`hacfed.server.runner.ConsoleTail`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("hacfed.server.driver")


class ConsoleLog:
    """Appends console lines to a file (or hands them to a sink: tests), and logs them."""

    def __init__(self, path: Path, sink: Callable[[str], None] | None = None) -> None:
        self._path = path
        self._sink = sink

    def __call__(self, line: str) -> None:
        """One console line: to the sink given (tests) or appended to <state-dir>/console.log, which
        hacfed-server prints; also logged. Always exactly one line: any control character left in it
        (a peer's text that escaped `printable` / `safe_text`) is shown escaped, never obeyed."""
        line = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in line)
        log.info("%s", line)
        if self._sink is not None:
            self._sink(line)
            return
        try:
            with open(self._path, "a", encoding="utf-8") as fh:
                fh.write(line + "\n")
        except OSError as exc:  # a full disk: the line stays in the log; hacfed-server says PAUSED itself
            log.warning("console line not written to %s: %s", self._path, exc)
