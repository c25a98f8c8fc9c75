"""The demo presets ship warmed up (hacfed/models/presets/, rebuilt by scripts/build_presets.py): each
is the current recipe's build, and a first demo copies it instead of warming up; a stale copy, another
seed or `--force` warms up as before."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hacfed.models import shipped, store, zoo
from hacfed.tools import cli
from hacfed.tools.demo import DEFAULT_AGENTS, prepare_agent

FILES = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
         "chat_template.jinja", "hacfed_model.json"}
MAX_BYTES = 12_000_000  # three ~0.8M-parameter float32 models with their tokenizers: about 10.2 MB


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("HACFED_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def warm_ups(monkeypatch) -> list[str]:
    """The zoo's warm-up replaced by a stand-in that records its calls and saves an untrained model."""
    calls: list[str] = []

    def fake(name: str, seed: int, out: Path, *, progress: bool = True) -> dict:
        calls.append(name)
        model, tokenizer = zoo.build_untrained(name, seed)
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        return {"heldout_accuracy": 0.0, "warmup_steps": 1, "warmup_seconds": 0.0}

    monkeypatch.setattr(zoo, "build_warmed_up", fake)
    return calls


def current_hash(name: str) -> str:
    return store.recipe_hash(zoo.preset_recipe(name, 0))


def test_the_demo_presets_are_the_ones_that_ship():
    assert shipped.SHIPPED_PRESETS == tuple(DEFAULT_AGENTS.split(","))


@pytest.mark.parametrize("name", shipped.SHIPPED_PRESETS)
def test_each_shipped_preset_is_its_current_recipes_build(name):
    """A recipe changed without `scripts/build_presets.py` fails here."""
    directory = shipped.shipped_dir(name)
    assert {p.name for p in directory.iterdir()} == FILES
    meta = json.loads((directory / "hacfed_model.json").read_text())
    assert meta["recipe"] == zoo.preset_recipe(name, 0), f"{name}: rerun scripts/build_presets.py {name}"
    assert meta["recipe_hash"] == current_hash(name) and meta["preset"] == name and meta["seed"] == 0
    band = zoo.get_preset(name).warmup
    assert band.target_accuracy <= meta["heldout_accuracy"] <= band.max_accuracy
    assert shipped.current_copy(name, 0, current_hash(name)) == directory


@pytest.mark.parametrize("name", shipped.SHIPPED_PRESETS)
def test_each_shipped_config_and_tokenizer_is_what_the_code_builds(name, tmp_path):
    """What the recipe hash does not cover (tokenizer and model code) is compared file by file."""
    model, tokenizer = zoo.build_untrained(name, 0)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    for file in sorted(FILES - {"model.safetensors", "hacfed_model.json"}):
        assert (tmp_path / file).read_bytes() == (shipped.shipped_dir(name) / file).read_bytes(), f"{name}/{file}"


def test_the_shipped_presets_are_a_few_megabytes():
    total = sum(p.stat().st_size for name in shipped.SHIPPED_PRESETS for p in shipped.shipped_dir(name).iterdir())
    assert total <= MAX_BYTES, total


def test_first_use_copies_the_shipped_preset_without_a_warm_up(warm_ups, home):
    path = store.ensure_built("tiny-qwen2", progress=False)
    assert warm_ups == [] and path == home / "models" / "tiny-qwen2"
    source = shipped.shipped_dir("tiny-qwen2")
    assert shipped.differences(path, source) == []
    meta, shipped_meta = store.read_metadata(path), json.loads((source / "hacfed_model.json").read_text())
    assert meta["shipped"] is True and meta["recipe_hash"] == current_hash("tiny-qwen2")
    assert meta["heldout_accuracy"] == shipped_meta["heldout_accuracy"]
    from hacfed.models.loading import load_model

    loaded = load_model("tiny-qwen2")
    assert zoo.parameter_count(loaded.model) == shipped_meta["parameters"]


def test_the_demos_first_run_copies_the_three_presets_and_warms_up_none(warm_ups, capsys):
    for name in shipped.SHIPPED_PRESETS:
        prepare_agent(store, name)
    out = capsys.readouterr().out.splitlines()
    assert warm_ups == []
    assert [line.split(":")[0] for line in out] == [f"[demo] {name} ready (shipped with hacfed, no warm-up)"
                                                    for name in shipped.SHIPPED_PRESETS]
    prepare_agent(store, "tiny-llama")
    assert capsys.readouterr().out.startswith("[demo] tiny-llama ready (cached): held-out accuracy 0.")


def test_a_stale_shipped_copy_is_not_used(warm_ups, tmp_path, monkeypatch, capsys):
    root = tmp_path / "presets"
    shutil.copytree(shipped.shipped_dir("tiny-gpt2"), root / "tiny-gpt2")
    meta_file = root / "tiny-gpt2" / "hacfed_model.json"
    meta_file.write_text(json.dumps({**json.loads(meta_file.read_text()), "recipe_hash": "an-older-recipe"}))
    monkeypatch.setattr(shipped, "SHIPPED_ROOT", root)
    prepare_agent(store, "tiny-gpt2")
    assert warm_ups == ["tiny-gpt2"]
    assert capsys.readouterr().out.startswith("[demo] tiny-gpt2: building and warming up (first use;")
    assert "shipped" not in store.read_metadata(store.model_dir("tiny-gpt2"))


def test_force_and_other_seeds_warm_up(warm_ups):
    store.ensure_built("tiny-llama", 0, force=True, progress=False)
    store.ensure_built("tiny-llama", 1, progress=False)
    assert warm_ups == ["tiny-llama", "tiny-llama"]


def test_models_list_says_which_presets_ship(capsys):
    assert cli.main(["models", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for name in zoo.PRESETS:
        line = next(line for line in lines if line.split()[:1] == [name])
        expected = "shipped warmed up" if name in shipped.SHIPPED_PRESETS else "not built"
        assert expected in line, line
