"""`hacfed` command line: `hacfed models build NAME`, `hacfed sim ...`, `hacfed demo ...`.

Thin: parses arguments first, imports heavy modules only inside the chosen subcommand.
"""

from __future__ import annotations

import argparse
import sys


def _not_available(name: str) -> int:
    print(f"hacfed {name}: not available yet in this version of hacfed", file=sys.stderr)
    return 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hacfed", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="local federation of tiny heterogeneous agents over real Flower processes")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return _not_available(args.command)


if __name__ == "__main__":
    sys.exit(main())
