"""`hacfed bench modes`: rerun the modes comparison of a matrix file and regenerate its report.

    hacfed bench modes --matrix bench/modes.toml --out runs/modes   # run what is missing, then report

A one-minute smoke version that leaves docs/ alone:

    hacfed bench modes --matrix bench/smoke.toml --out runs/smoke \\
        --results runs/smoke/results.md --img-dir runs/smoke/img

Each (setting, mode, seed) is one `hacfed sim` subprocess (`runner.py`); finished runs are kept, so
an interrupted command resumes where it stopped. The report (`report.py`) replaces the generated
section of docs/results.md and writes one learning-curve PNG per setting under docs/img/.
`--report-only` skips running and rebuilds the report from the complete runs on disk.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

DEFAULT_RESULTS = "docs/results.md"
DEFAULT_IMG_DIR = "docs/img"


def add_parser(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="experiments made of many sim runs, with a generated report")
    kinds = bench.add_subparsers(dest="bench_command", required=True)
    p = kinds.add_parser("modes", help="modes × seeds × settings from a TOML matrix; resumable; writes docs/results.md",
                         description=__doc__.splitlines()[0])
    p.add_argument("--matrix", required=True, help="matrix TOML file (e.g. bench/modes.toml)")
    p.add_argument("--out", required=True, help="run directory: OUT/SETTING/MODE/seed-S.jsonl (+ .log)")
    p.add_argument("--jobs", type=int, default=2, help="runs at once, one torch thread each (default 2)")
    p.add_argument("--only", action="append", default=[], metavar="SETTING",
                   help="run only this setting (repeatable or comma-separated; the only way to rerun an "
                        "archived one); the report still covers all")
    p.add_argument("--report-only", action="store_true", help="run nothing; rebuild the report from complete runs")
    p.add_argument(
        "--results", default=DEFAULT_RESULTS, help=f"markdown file for the report (default {DEFAULT_RESULTS})"
    )
    p.add_argument("--img-dir", default=DEFAULT_IMG_DIR, help=f"directory for the PNGs (default {DEFAULT_IMG_DIR})")


def run_from_args(args: argparse.Namespace) -> int:
    try:
        return _run_checked(args)
    except KeyboardInterrupt:
        print("hacfed bench modes: interrupted (Ctrl-C); complete runs are kept", file=sys.stderr)
        return 130
    except ValueError as exc:  # bad matrix, stale run directory, bad markers: one line, no traceback
        print(f"hacfed bench modes: error: {exc}", file=sys.stderr)
        return 2


def _run_checked(args: argparse.Namespace) -> int:
    from hacfed.tools.experiments.matrix import load_matrix
    from hacfed.tools.experiments.report import NothingToReport, ReportPaths, write_report
    from hacfed.tools.experiments.runner import plan_runs, run_matrix

    matrix = load_matrix(args.matrix)
    only = [name.strip() for item in args.only for name in item.split(",") if name.strip()]
    for name in only:
        matrix.setting(name)  # an unknown name is an error before anything runs
    if args.jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
    out = Path(args.out)
    failed = []
    if not args.report_only:
        runs = plan_runs(matrix, only)
        failed = run_matrix(runs, out, jobs=args.jobs)
    paths = ReportPaths(Path(args.results), Path(args.img_dir), _command(args))
    try:
        written = write_report(matrix, out, paths)
        print(f"report: {', '.join(str(p) for p in written)}")
    except NothingToReport as exc:
        if not failed:
            raise
        print(f"hacfed bench modes: {exc}", file=sys.stderr)
    if failed:
        logs = ", ".join(str(r.log_path(out)) for r in failed)
        print(f"{len(failed)} run(s) failed; logs: {logs}. Rerun the same command to retry them "
              "(complete runs are kept).", file=sys.stderr)
        return 1
    return 0


def _command(args: argparse.Namespace) -> str:
    """The command that regenerates the report, as the user would type it (no --only, no --jobs)."""
    parts = ["hacfed", "bench", "modes", "--matrix", args.matrix, "--out", args.out]
    if args.results != DEFAULT_RESULTS:
        parts += ["--results", args.results]
    if args.img_dir != DEFAULT_IMG_DIR:
        parts += ["--img-dir", args.img_dir]
    return shlex.join(parts)
