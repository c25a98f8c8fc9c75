"""`hacfed models export`: a plain Hugging Face directory that transformers, TRL and hacfed load."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hacfed.models import store
from hacfed.models.export import export_model, is_quantized
from hacfed.models.loading import load_model
from hacfed.models.zoo import build_untrained, preset_recipe
from hacfed.tools.cli import main


@pytest.fixture(scope="module", autouse=True)
def home(tmp_path_factory):
    """A preset cache of untrained tiny models (no warm-up), and no hub cache."""
    root = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HACFED_HOME", str(root / "hacfed"))
        mp.setenv("HF_HOME", str(root / "hf"))
        mp.setenv("HF_HUB_OFFLINE", "1")
        for name in ("tiny-qwen2", "tiny-gpt2"):
            store.ensure_built(name, builder=_save_untrained, expected_hash=store.recipe_hash(preset_recipe(name, 0)))
        yield root


def _save_untrained(name, seed, out):
    model, tok = build_untrained(name, seed)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return {"heldout_accuracy": 0.0}


@pytest.fixture(scope="module")
def exported(home):
    directory = home / "export" / "tiny-qwen2"
    return export_model("tiny-qwen2", directory), directory


def test_export_writes_a_plain_directory_with_the_same_weights(exported):
    out, directory = exported
    names = {p.name for p in directory.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= names
    assert "quantization_config" not in json.loads((directory / "config.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    assert tokenizer.chat_template and not is_quantized(model) and out.parameters == model.num_parameters()
    source = load_model("tiny-qwen2", progress=False).model.state_dict()
    assert all(torch.equal(source[k], v) for k, v in model.state_dict().items())


def test_hacfed_loads_the_exported_directory_as_a_local_model(exported):
    _, directory = exported
    loaded = load_model(str(directory), progress=False)
    assert loaded.source == "local" and loaded.tokenizer.chat_template


@pytest.mark.skipif(
    importlib.util.find_spec("trl") is None, reason="TRL is the bench extra (pip install -e '.[bench]')"
)
def test_trl_grpo_trainer_accepts_the_exported_directory(exported, tmp_path):
    import trl
    from datasets import Dataset

    _, directory = exported
    args = trl.GRPOConfig(output_dir=str(tmp_path / "trl"), per_device_train_batch_size=2, num_generations=2,
                          max_completion_length=4, max_steps=1, report_to=[], use_cpu=True, logging_steps=1,
                          save_strategy="no")
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": "1+1="}]}] * 4)
    trainer = trl.GRPOTrainer(model=str(directory), reward_funcs=lambda completions, **_: [0.0] * len(completions),
                              args=args, train_dataset=data)
    trainer.train()
    assert trainer.state.global_step == 1


def test_export_refuses_a_used_directory_in_one_line(exported, capsys):
    _, directory = exported
    assert main(["models", "export", "tiny-qwen2", str(directory)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already exists and is not an empty directory" in err


def test_export_cli_prints_where_it_wrote(tmp_path, capsys):
    assert main(["models", "export", "tiny-gpt2", str(tmp_path / "out")]) == 0
    assert f"tiny-gpt2: wrote {tmp_path / 'out'}" in capsys.readouterr().out
