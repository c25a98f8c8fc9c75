"""What makes a loaded causal LM ready for RL in hacfed, whatever it came from (a zoo preset, a local
directory, SmolLM2's GGUF): a pad token, a chat template, every dropout 0 (the rollout policy and
the trained policy must be the same function), eval mode, and a generation config without hidden
sampling defaults.

    prepare_for_rl(model, tokenizer, "smollm2")
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast


def configure_generation(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast) -> None:
    """Make `model.generation_config` agree with the tokenizer and sample from the full distribution.

    transformers' defaults (top_k=50, a 20-token max_length) silently change the sampling
    distribution and bias every importance ratio; callers pass their own sampling settings.
    """
    gen = model.generation_config
    gen.pad_token_id = tokenizer.pad_token_id
    gen.eos_token_id = tokenizer.eos_token_id
    gen.bos_token_id = tokenizer.bos_token_id
    gen.do_sample = False
    gen.temperature = 1.0
    gen.top_k = None
    gen.top_p = 1.0
    gen.max_length = None


def prepare_for_rl(model: PreTrainedModel, tokenizer: Any, name: str) -> None:
    """Pad token, chat template, no dropout, eval mode, generation config without hidden defaults."""
    if tokenizer.eos_token_id is None:
        raise ValueError(f"model {name!r}: its tokenizer has no eos token, so completions cannot stop")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token  # only ever used under an attention mask
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"model {name!r}: its tokenizer has no chat template; hacfed renders every prompt with one")
    disable_dropout(model)
    model.eval()
    configure_generation(model, tokenizer)


def disable_dropout(model: torch.nn.Module) -> None:
    """Set every dropout probability to 0: config fields (GPT-2's resid/embd/attn/summary pdrop,
    Llama/Qwen2's attention_dropout), nn.Dropout modules, and float attributes attention layers
    read at call time."""
    for key, value in model.config.to_dict().items():
        if isinstance(value, float) and ("dropout" in key or "pdrop" in key):
            setattr(model.config, key, 0.0)
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        for attr in ("attention_dropout", "dropout"):
            if isinstance(getattr(module, attr, None), float):
                setattr(module, attr, 0.0)
