"""A preset with a pretrained base (smollm2-drilled) fine-tunes that base and caches an ordinary model
directory, which hacfed loads like any preset. A tiny stand-in plays the base, so no 135M model trains."""

from __future__ import annotations

import json

import pytest
import torch

from hacfed.models import gguf, loading, zoo
from hacfed.models.warmup import WarmupConfig


@pytest.fixture
def stand_in_base(monkeypatch: pytest.MonkeyPatch):
    """SmolLM2's GGUF load answers a tiny Llama (seed 7) that carries a GGUF-style quantization config."""
    base_model, base_tokenizer = zoo.build_untrained("tiny-llama", seed=7)
    base_model.config.quantization_config = {"quant_method": "gguf"}
    monkeypatch.setattr(gguf, "load_smollm2", lambda dtype=None: (base_model, base_tokenizer))
    preset = zoo.Preset("tiny-drilled", "llama", zoo.BASE_TOKENIZER, {}, base="smollm2",
                        warmup=WarmupConfig(fixed_steps=True, max_steps=1, batch_size=4, learning_rate=1e-9,
                                            lr_warmup_steps=0, eval_max_new_tokens=4),
                        task={"kind": "arithmetic", "style": "words", "solution_form": "worked", "num_train": 20,
                              "num_eval": 4, "num_validation": 4})
    monkeypatch.setattr(zoo, "PRESETS", {**zoo.PRESETS, preset.name: preset})
    return {k: v.clone() for k, v in base_model.state_dict().items()}


def test_a_base_preset_fine_tunes_its_base_and_saves_an_ordinary_model(stand_in_base, tmp_path):
    meta = zoo.build_warmed_up("tiny-drilled", 0, tmp_path, progress=False)
    assert meta["tokenizer"] == "base" and meta["recipe"]["preset"]["base"] == "smollm2"
    config = json.loads((tmp_path / "config.json").read_text())
    assert "quantization_config" not in config  # saved as plain weights, loadable by anyone
    loaded = loading.load_model(str(tmp_path), progress=False)
    fresh = zoo.build_untrained("tiny-llama", seed=0)[0].state_dict()
    for key, value in loaded.model.state_dict().items():
        # one step at lr 1e-9 from the base: the base's weights, not a new initialisation
        assert torch.allclose(value, stand_in_base[key], atol=1e-6), key
    assert any(not torch.equal(stand_in_base[k], fresh[k]) for k in fresh)
