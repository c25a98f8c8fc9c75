"""The coordinator's status files survive a kill -9 mid-write (server/run_end.py `write_status`,
server/runner.py `rounds_progress`).

CI once saw a restarted hacfed-server stop at once with `error: Expecting value: line 1 column 1`: the
kill -9 of the fault test had come while the ServerApp rewrote `driver-status.json` in place, and the
new hacfed-server read the empty file. The file is now replaced whole (`write_atomic`), and a torn one
left by an older version says "no progress known" instead of stopping the server.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

import hacfed.envelope
from hacfed.server.driver_settings import STATUS_FILE
from hacfed.server.run_end import write_status
from hacfed.server.runner import rounds_progress


def _coordinator(next_round: int, open_rounds: list[int]) -> SimpleNamespace:
    return SimpleNamespace(next_round_id=next_round, current_round=open_rounds[-1] if open_rounds else None,
                           open_rounds=lambda: list(open_rounds))


def test_a_status_write_that_dies_before_its_rename_leaves_the_previous_status_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_status(tmp_path, _coordinator(2, [1]), done=False)
    before = (tmp_path / STATUS_FILE).read_text(encoding="utf-8")

    def killed(*args: object) -> None:  # the process dies between writing the new text and the rename
        raise OSError("killed")

    monkeypatch.setattr(hacfed.envelope.os, "replace", killed)
    with pytest.raises(OSError, match="killed"):
        write_status(tmp_path, _coordinator(3, [2]), done=False)
    assert (tmp_path / STATUS_FILE).read_text(encoding="utf-8") == before
    assert json.loads(before)["next_round"] == 2
    assert [p.name for p in tmp_path.iterdir()] == [STATUS_FILE]  # no temporary file left behind
    assert rounds_progress(tmp_path) == (2, 1, (1,))


@pytest.mark.parametrize("text", ["", "{\"next_round\": 3, \"open", "[]", "{\"open_round\": 1}"])
def test_a_torn_or_foreign_status_file_says_no_progress_instead_of_stopping_the_server(tmp_path: Path,
                                                                                       text: str) -> None:
    (tmp_path / STATUS_FILE).write_text(text, encoding="utf-8")
    assert rounds_progress(tmp_path) == (-1, None, ())
    assert rounds_progress(tmp_path / "missing") == (-1, None, ())
