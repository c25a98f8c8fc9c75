"""Rebuild the warmed-up demo presets that ship in hacfed/models/presets/ from their recipes.

    .venv/bin/python scripts/build_presets.py                # all three, then commit what changed
    .venv/bin/python scripts/build_presets.py tiny-gpt2      # one
    .venv/bin/python scripts/build_presets.py --check        # rebuild in a temp dir, compare, change nothing

Each preset is warmed up from scratch (`hacfed models build NAME --force`, seed 0) in a temporary
HACFED_HOME on one torch thread, then copied, as the store published it, into
hacfed/models/presets/NAME/. On one machine the same recipe gives the same bytes (weights, config,
tokenizer); the metadata's timings differ. tests/unit/test_shipped_presets.py fails when a recipe
changes without a rebuild. --check exits 1 and names every file that differs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ["OMP_NUM_THREADS"] = "1"  # before torch loads: one thread, as the tests and labs build


def main(argv: list[str] | None = None) -> int:
    from hacfed.models import shipped, store

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=list(shipped.SHIPPED_PRESETS), metavar="NAME",
                        help=f"presets to rebuild (default: {', '.join(shipped.SHIPPED_PRESETS)})")
    parser.add_argument("--check", action="store_true", help="compare a fresh build with the shipped copy only")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in shipped.SHIPPED_PRESETS]
    if unknown:
        print(f"build_presets: error: {unknown} do not ship; shipped: {', '.join(shipped.SHIPPED_PRESETS)}",
              file=sys.stderr)
        return 2
    import torch

    torch.set_num_threads(1)
    differ = False
    with tempfile.TemporaryDirectory(prefix="hacfed-presets-") as home:
        os.environ["HACFED_HOME"] = home
        for name in args.names:
            built = store.ensure_built(name, 0, force=True, progress=sys.stderr.isatty())
            meta = store.read_metadata(built) or {}
            print(f"{name}: held-out accuracy {meta.get('heldout_accuracy')} after {meta.get('warmup_steps')} "
                  f"warm-up steps ({meta.get('warmup_seconds')} s)")
            target = shipped.shipped_dir(name)
            found = shipped.differences(built, target)
            for line in found:
                print(f"  {line}")
            differ = differ or bool(found)
            if not args.check and found:
                _replace(built, target)
                print(f"  wrote {target}")
    if args.check:
        print("the shipped presets differ from a fresh build" if differ else "the shipped presets are what "
              "their recipes build")
        return 1 if differ else 0
    return 0


def _replace(built: Path, target: Path) -> None:
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(built, target)
    for path in (target, *target.iterdir()):
        os.chmod(path, 0o755 if path.is_dir() else 0o644)


if __name__ == "__main__":
    sys.exit(main())
