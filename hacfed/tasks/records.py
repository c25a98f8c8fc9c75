"""Columns of a task's data, from any source `datasets` reads, chosen by the path itself:

  *.jsonl, *.json     JSON lines (or a JSON array), `datasets.load_dataset("json")`
  *.parquet           `load_dataset("parquet")`
  *.csv               `load_dataset("csv")` (a header row names the fields)
  *.arrow             `load_dataset("arrow")`
  a directory         written by `Dataset.save_to_disk`, read with `datasets.load_from_disk`; for a
                      saved DatasetDict, name one split's folder (`data/train`)

Every user mistake is a ValueError of one line naming the path: a missing path, an empty file, a
file the format cannot parse (for JSON lines, the line number as an editor shows it, from 1), a
missing field (with the fields the records do have), no records. `datasets` logs nothing meanwhile.

    questions, answers = read_fields("data/train.csv", ("question", "answer"))
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv", ".arrow": "arrow"}


def data_source(path: str) -> str:
    """The `datasets` builder for a file, or "disk" for a save_to_disk directory; ValueError otherwise."""
    where = Path(path)
    if where.is_dir():
        return "disk"
    if not where.is_file():
        raise ValueError(f"data file not found: {path}")
    builder = BUILDERS.get(where.suffix.lower())
    if builder is None:
        raise ValueError(f"{path}: unknown data format {where.suffix!r}; use {', '.join(BUILDERS)} "
                         f"or a save_to_disk directory")
    if where.stat().st_size == 0:
        raise ValueError(f"data file is empty: {path}")
    return builder


def read_fields(path: str, fields: tuple[str, ...], cache_dir: str | None = None) -> tuple[list[Any], ...]:
    """The named columns of the records at `path`, in record order."""
    source = data_source(path)
    if Path(path).suffix.lower() == ".jsonl":
        check_json_lines(path)
    import datasets  # heavy (pyarrow, pandas): imported only when data is actually read
    import pyarrow

    bars_were_on = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    verbosity = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # its errors come back as the one line below
    try:
        if source == "disk":
            dataset = datasets.load_from_disk(path)
        else:
            dataset = datasets.load_dataset(source, data_files=[str(path)], split="train", cache_dir=cache_dir)
    except (datasets.exceptions.DatasetGenerationError, pyarrow.ArrowException, FileNotFoundError, ValueError) as e:
        if isinstance(e, ValueError) and "corresponds to no data" in str(e):  # a CSV with its header only
            raise ValueError(f"{path}: no records") from None
        cause = e.__cause__ if e.__cause__ is not None else e
        raise ValueError(f"{path}: cannot be read as {source}: {_one_line(cause)}") from e
    finally:
        datasets.logging.set_verbosity(verbosity)
        if bars_were_on:
            datasets.enable_progress_bars()
    if isinstance(dataset, datasets.DatasetDict):
        splits = sorted(dataset)
        raise ValueError(f"{path}: a saved DatasetDict with splits {splits}; name one split's folder, "
                         f"e.g. {Path(path) / splits[0]}")
    missing = [f for f in fields if f not in dataset.column_names]
    if missing:
        raise ValueError(f"{path}: missing field(s) {missing}; the records have {dataset.column_names}")
    if len(dataset) == 0:
        raise ValueError(f"{path}: no records")
    return tuple(list(dataset[f]) for f in fields)


def check_json_lines(path: str) -> None:
    """Each non-blank line of a JSON-lines file is a JSON object; else one line naming the line (from 1)."""
    with open(path, encoding="utf-8", errors="replace") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}, line {number}: not valid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{path}, line {number}: a JSON {type(record).__name__}, not an object (a record)")


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return (text[:300] + "...") if len(text) > 300 else text or type(error).__name__
