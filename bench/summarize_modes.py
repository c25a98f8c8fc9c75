"""Summarize bench/compare_modes.sh: final held-out accuracy per agent and mode, mean ± spread over seeds.

    .venv/bin/python bench/summarize_modes.py runs/modes

Spread is half the range (max − min) / 2 over seeds; "start" is the shared warm-up accuracy.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

MODES = ("hacpo", "gspo", "gspo2", "naive")


def load(directory: Path) -> dict[tuple[str, int], list[dict]]:
    runs = {}
    for path in sorted(directory.glob("*-s*.jsonl")):
        mode, seed = path.stem.rsplit("-s", 1)
        runs[(mode, int(seed))] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return runs


def final_accuracy(rows: list[dict], agent: str) -> float | None:
    finals = [r["eval_accuracy"] for r in rows if r["agent"] == agent and r.get("final")]
    return finals[0] if finals else None


def start_accuracy(rows: list[dict], agent: str) -> float | None:
    evals = sorted((r["round"], r["eval_accuracy"]) for r in rows if r["agent"] == agent and "eval_accuracy" in r)
    return evals[0][1] if evals else None


def main(directory: str) -> int:
    runs = load(Path(directory))
    if not runs:
        print(f"no runs in {directory}", file=sys.stderr)
        return 1
    agents = sorted({r["agent"] for rows in runs.values() for r in rows})
    header = "| agent | start | " + " | ".join(MODES) + " |"
    print(header)
    print("|" + "---|" * (len(MODES) + 2))
    for agent in agents:
        starts = [start_accuracy(rows, agent) for rows in runs.values()]
        cells = []
        for mode in MODES:
            values = [v for (m, _), rows in sorted(runs.items()) if m == mode
                      for v in [final_accuracy(rows, agent)] if v is not None]
            if not values:
                cells.append("-")
                continue
            spread = (max(values) - min(values)) / 2
            cells.append(f"{statistics.mean(values):.3f} ± {spread:.3f} (n={len(values)})")
        start = next((s for s in starts if s is not None), None)
        print(f"| {agent} | {start:.3f} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "runs/modes"))
