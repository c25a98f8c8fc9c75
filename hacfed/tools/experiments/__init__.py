"""Experiments made of many `hacfed sim` runs, with a generated report.

    hacfed bench modes --matrix bench/modes.toml --out runs/modes

`matrix.py` (the TOML spec), `runner.py` (the resumable subprocess runner), `stats.py` (t intervals,
paired differences), `results.py` (reading runs back), `report.py` + `curves.py` (markdown and PNG),
`bench_modes.py` (the command line).
"""
