"""A rollout keeps each step's log-prob as it goes (`hacfed.rollout.hf.StepLogprobs`), not every
step's logits: the token ids and log-probs are exactly those read from `generate`'s stored raw
logits (`output_logits`), the same seed drawing the same tokens."""

from __future__ import annotations

import pytest
import torch

from hacfed.models.zoo import build_untrained
from hacfed.rollout import generate
from hacfed.rollout.hf import generation_config, left_pad, special_token_ids
from hacfed.rollout.logprobs import gather_token_logprobs
from hacfed.trajectory import ChatMessage, render_prompt_ids

PROMPTS = [[ChatMessage("user", "2+3=")], [ChatMessage("user", "12+30=")], [ChatMessage("user", "7+8=")]]


def stored_logits_rollout(model, tok, prompts, num_samples: int, max_new_tokens: int, temperature: float, seed: int):
    """The rollout read from every step's stored raw logits: (token ids, log-probs) per completion."""
    eos, pad = special_token_ids(tok)
    rows = [render_prompt_ids(tok, m) for m in prompts for _ in range(num_samples)]
    input_ids, mask = left_pad(rows, pad, torch.device("cpu"))
    config = generation_config(max_new_tokens=max_new_tokens, temperature=temperature, top_p=1.0, greedy=False,
                               eos_id=eos, pad_id=pad)
    config.output_logits = True
    model.eval()
    with torch.inference_mode(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        out = model.generate(input_ids=input_ids, attention_mask=mask, generation_config=config)
    new = out.sequences[:, input_ids.shape[1]:]
    logps = torch.stack([gather_token_logprobs(step, new[:, t], temperature) for t, step in enumerate(out.logits)], 1)
    completions = []
    for ids, lp in zip(new.tolist(), logps.tolist()):
        cut = ids.index(eos) if eos in ids else len(ids)
        completions.append((tuple(ids[:cut]), tuple(lp[:cut])))
    return completions


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-gpt2"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_step_logprobs_are_the_stored_logits_ones(preset, temperature):
    model, tok = build_untrained(preset, seed=0)
    want = stored_logits_rollout(model, tok, PROMPTS, 4, 12, temperature, seed=5)
    groups = generate(model, tok, PROMPTS, num_samples=4, max_new_tokens=12, temperature=temperature, seed=5)
    got = [(c.token_ids, c.logprobs) for group in groups for c in group]
    assert [ids for ids, _ in got] == [ids for ids, _ in want]
    assert got == want  # bitwise: the same float32 gather of the same logits
    assert sum(len(ids) for ids, _ in got) > 3 * len(got)  # long enough to read several steps each
