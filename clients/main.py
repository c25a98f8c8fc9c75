"""`hacfed-client --model MODEL --server HOST:PORT`: a lab joins a federation."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    print("hacfed-client: not available yet in this version of hacfed", file=sys.stderr)
    return 2
