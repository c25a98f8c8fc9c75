"""A model given as a path that does not exist is refused as "no such directory", not "unknown model",
by hacfed-client (before any file is created) and by hacfed sim (where load_model resolves it)."""

from __future__ import annotations

import pytest

from hacfed.keys import ensure_key_pair
from hacfed.model_spec import check_model_spec

MISSING = ["/nonexistent/model", "./no/such/model", "~/no-such-model-dir", "models/llama/v2"]


@pytest.mark.parametrize("spec", MISSING)
def test_check_model_spec_says_no_such_directory(spec):
    with pytest.raises(ValueError, match="no such directory") as info:
        check_model_spec(spec)
    assert "unknown model" not in str(info.value)


@pytest.mark.parametrize("spec", ["no-such-model", "org/not-cached-model"])
def test_a_bare_name_or_hub_id_is_not_called_a_directory(spec):
    with pytest.raises(ValueError) as info:
        check_model_spec(spec)
    assert "no such directory" not in str(info.value)


def test_load_model_says_no_such_directory():
    from hacfed.models.loading import load_model

    with pytest.raises(ValueError, match="no such directory"):
        load_model("/nonexistent/model")


def test_hacfed_client_refuses_a_missing_model_directory_in_one_line(tmp_path, capsys):
    from hacfed.clients.main import main

    key = ensure_key_pair(tmp_path / "coordinator", "coordinator").public
    state = tmp_path / "lab"
    code = main(["--model", "/nonexistent/model", "--server", "127.0.0.1:9092", "--participant-id", "lab-a",
                 "--state-dir", str(state), "--coordinator-key", str(key), "--insecure"])
    err = capsys.readouterr().err
    assert code == 2 and "no such directory" in err and err.count("\n") == 1, err
    assert not state.exists()


def test_hacfed_sim_refuses_a_missing_model_directory_in_one_line(tmp_path, capsys):
    from hacfed.tools.cli import main

    code = main(["sim", "--agents", "/nonexistent/model", "--rounds", "1",
                 "--metrics-out", str(tmp_path / "m.jsonl")])
    err = capsys.readouterr().err
    assert code == 2 and "no such directory" in err, err
    assert "Traceback" not in err
