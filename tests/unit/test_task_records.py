"""Task data from any source `datasets` reads (hacfed.tasks.records): files by their suffix, a
save_to_disk directory, and one-line errors. Load-level mistakes are in test_task_plugin.py."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from hacfed.tasks.records import read_fields

CACHE = tempfile.mkdtemp(prefix="hacfed-records-tests-")  # datasets' cache, not the home directory's


@pytest.fixture(scope="module", autouse=True)
def _cache() -> Iterator[None]:
    yield
    shutil.rmtree(CACHE, ignore_errors=True)


def refusal(call) -> str:
    with pytest.raises(ValueError) as info:
        call()
    assert "\n" not in str(info.value)
    return str(info.value)


def _write_words(tmp_path: Path, fmt: str) -> str:
    import datasets

    rows = {"word": ["apple", "river"], "backwards": ["elppa", "revir"]}
    if fmt == "csv":
        (tmp_path / "d.csv").write_text("word,backwards\napple,elppa\nriver,revir\n")
        return "d.csv"
    if fmt == "json":
        (tmp_path / "d.json").write_text(
            '[{"word": "apple", "backwards": "elppa"}, {"word": "river", "backwards": "revir"}]'
        )
        return "d.json"
    if fmt == "parquet":
        datasets.Dataset.from_dict(rows).to_parquet(str(tmp_path / "d.parquet"))
        return "d.parquet"
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "saved"))
    if fmt == "arrow":  # the Arrow file save_to_disk wrote
        return str(next((tmp_path / "saved").glob("*.arrow")).relative_to(tmp_path))
    return "saved"


@pytest.mark.parametrize("fmt", ["csv", "json", "parquet", "disk", "arrow"])
def test_read_fields_reads_every_format_datasets_reads(tmp_path: Path, fmt: str) -> None:
    path = _write_words(tmp_path, fmt)
    assert read_fields(str(tmp_path / path), ("word", "backwards"), CACHE) == (
        ["apple", "river"], ["elppa", "revir"])


def test_a_saved_dataset_dict_asks_for_one_split(tmp_path: Path) -> None:
    import datasets

    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"question": ["a"], "answer": ["b"]})}).save_to_disk(
        str(tmp_path / "dd"))
    message = refusal(lambda: read_fields(str(tmp_path / "dd"), ("question",), CACHE))
    assert "a saved DatasetDict with splits ['train']; name one split's folder" in message


def test_a_bad_json_line_is_named_by_its_line_number_and_nothing_else_is_printed(
        tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    good = "".join(f'{{"question": "q{i}", "answer": "a{i}"}}\n' for i in range(4))
    (tmp_path / "t.jsonl").write_text(good + '{"question": oops}\n')  # line 5, as an editor numbers it
    capfd.readouterr()
    message = refusal(lambda: read_fields(str(tmp_path / "t.jsonl"), ("question", "answer")))
    assert message == f"{tmp_path / 't.jsonl'}, line 5: not valid JSON (Expecting value at column 14)"
    assert capfd.readouterr() == ("", "")
