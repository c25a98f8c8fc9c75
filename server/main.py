"""`hacfed-server`: the coordinator entry point."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    print("hacfed-server: not available yet in this version of hacfed", file=sys.stderr)
    return 2
