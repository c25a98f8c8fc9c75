"""SmolLM2 as hacfed loads it (GGUF, de-quantized) is refused by TRL; exported, transformers and TRL take it."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tests.smollm2 import NEEDS_SMOLLM2

pytestmark = pytest.mark.slow


@NEEDS_SMOLLM2
@pytest.mark.skipif(importlib.util.find_spec("trl") is None,
                    reason="TRL is the bench extra (pip install -e '.[bench]')")
def test_exported_smollm2_is_a_plain_model_trl_trains(tmp_path):
    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hacfed.models.export import export_model, is_quantized
    from hacfed.models.loading import load_model

    torch.set_num_threads(1)
    as_loaded = load_model("smollm2", progress=False).model
    assert is_quantized(as_loaded)  # the GGUF quantization config is why TRL refuses it
    out = export_model("smollm2", tmp_path / "smollm2")
    assert out.parameters > 100_000_000 and out.dtype == "float32"
    assert "quantization_config" not in json.loads((out.directory / "config.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(out.directory)
    assert not is_quantized(model)
    assert torch.equal(model.model.embed_tokens.weight, as_loaded.model.embed_tokens.weight)
    args = trl.GRPOConfig(output_dir=str(tmp_path / "trl"), per_device_train_batch_size=2, num_generations=2,
                          max_completion_length=4, max_steps=1, report_to=[], use_cpu=True, save_strategy="no")
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": "What is 2+2?"}]}] * 2)
    trainer = trl.GRPOTrainer(model=model, reward_funcs=lambda completions, **_: [1.0, 0.0] * (len(completions) // 2),
                              args=args, train_dataset=data,
                              processing_class=AutoTokenizer.from_pretrained(out.directory))
    trainer.train()
    assert trainer.state.global_step == 1
