"""Teacher-forced scoring (`sequence_logprobs`) and its agreement with the rollout engine.

The key property: the log-probs `generate` reports for its own samples are the ones the trainer
recomputes with `sequence_logprobs` under the same weights — for every zoo architecture, with left
padding and prompts of different lengths in one batch. If they disagreed, every on-policy
importance ratio would start away from 1.
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator

import pytest
import torch

from hacfed.models.zoo import build_untrained
from hacfed.rollout import generate, sequence_logprobs
from hacfed.rollout.logprobs import gather_token_logprobs, pack_prompt_response, positions_from_mask
from hacfed.trajectory import ChatMessage, render_prompt_ids

PRESETS = ("tiny-llama", "tiny-gpt2", "tiny-qwen2")

# Prompts whose rendered lengths differ a lot, so the batch carries real left padding.
PROMPTS = [
    [ChatMessage("user", "7+8=")],
    [ChatMessage("system", "Answer with a number."), ChatMessage("user", "What is 12+30? Think, then answer.")],
    [ChatMessage("user", "x")],
]


@pytest.fixture(scope="module", params=PRESETS)
def zoo_model(request):
    return build_untrained(request.param, seed=0)


@contextlib.contextmanager
def eos_bias(model, eos_id: int, bias: float) -> Iterator[None]:
    """Add `bias` to the EOS logit (in generate and in scoring alike) so random models also stop."""
    def hook(module, inputs, output):
        output = output.clone()
        output[..., eos_id] += bias
        return output

    handle = model.get_output_embeddings().register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def test_generate_logprobs_match_teacher_forced_recomputation(zoo_model):
    model, tok = zoo_model
    num_samples, max_new = 3, 10
    # EOS at ~e^3/(e^3+V) per step: some samples stop early while others in the batch run on.
    with eos_bias(model, tok.eos_token_id, 3.0):
        groups = generate(model, tok, PROMPTS, num_samples=num_samples, max_new_tokens=max_new, seed=11)
        flat = [c for group in groups for c in group]
        prompt_ids = [render_prompt_ids(tok, p) for p in PROMPTS for _ in range(num_samples)]
        with torch.inference_mode():
            logp, mask = sequence_logprobs(model, prompt_ids, [c.token_ids for c in flat], tok.pad_token_id)
    assert len({len(p) for p in prompt_ids}) == len(PROMPTS)  # really different prompt lengths
    reasons = {c.finish_reason for c in flat}
    assert reasons == {"stop", "length"}, reasons  # both paths exercised in one batch
    assert mask.sum(1).tolist() == [len(c.token_ids) for c in flat]
    for row, completion in enumerate(flat):
        n = len(completion.token_ids)
        torch.testing.assert_close(logp[row, :n], torch.tensor(completion.logprobs), atol=2e-5, rtol=0)
        assert logp[row].sum().item() == pytest.approx(completion.logprob_sum, abs=1e-4)
        assert torch.all(logp[row, n:] == 0)


def test_scores_do_not_depend_on_left_padding(zoo_model):
    """Scoring a sequence alone (no padding) or beside a longer prompt must agree; this fails for
    GPT-2 if position ids are derived from the padded column instead of the attention mask."""
    model, tok = zoo_model
    short = render_prompt_ids(tok, PROMPTS[0])
    long = render_prompt_ids(tok, PROMPTS[1])
    response = tok("15 and more", add_special_tokens=False)["input_ids"]
    with torch.inference_mode():
        alone, _ = sequence_logprobs(model, [short], [response], tok.pad_token_id)
        batched, _ = sequence_logprobs(model, [long, short], [response[:3], response], tok.pad_token_id)
    torch.testing.assert_close(batched[1], alone[0], atol=1e-5, rtol=0)


def test_pack_prompt_response_layout():
    ids, attn, resp_mask, width = pack_prompt_response([[5, 6, 7], [8]], [[9], [3, 4]], pad_id=0)
    assert width == 3
    assert ids.tolist() == [[5, 6, 7, 9, 0], [0, 0, 8, 3, 4]]
    assert attn.tolist() == [[1, 1, 1, 1, 0], [0, 0, 1, 1, 1]]
    assert resp_mask.tolist() == [[True, False], [True, True]]
    # padding sits at position 0; real tokens count from 0 after it
    assert positions_from_mask(attn).tolist() == [[0, 1, 2, 3, 3], [0, 0, 0, 1, 2]]


def test_gather_token_logprobs_by_hand():
    # logits [0, ln 3] -> probs [1/4, 3/4]; token 1 -> ln 0.75, token 0 -> ln 0.25
    logits = torch.tensor([[0.0, math.log(3.0)], [0.0, math.log(3.0)]])
    out = gather_token_logprobs(logits, torch.tensor([1, 0]))
    torch.testing.assert_close(out, torch.tensor([math.log(0.75), math.log(0.25)]), atol=1e-6, rtol=0)


def test_sequence_logprobs_is_differentiable_and_masks_empty_responses():
    model, tok = build_untrained("tiny-llama", seed=1)
    prompt = render_prompt_ids(tok, PROMPTS[0])
    logp, mask = sequence_logprobs(model, [prompt, prompt], [[40, 41], []], tok.pad_token_id)
    assert logp.shape == mask.shape == (2, 2)
    assert mask.tolist() == [[True, True], [False, False]]
    assert torch.all(logp[0] < 0) and torch.all(logp[1] == 0)
    logp.sum().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and any(g.abs().sum() > 0 for g in grads)


def test_sequence_logprobs_rejects_bad_input():
    model, tok = build_untrained("tiny-llama", seed=1)
    with pytest.raises(ValueError, match="2 prompts but 1 responses"):
        sequence_logprobs(model, [[5], [6]], [[7]], tok.pad_token_id)
    with pytest.raises(ValueError, match="sequence 1: empty prompt"):
        sequence_logprobs(model, [[5], []], [[7], [8]], tok.pad_token_id)
    with pytest.raises(ValueError, match="at least one sequence"):
        sequence_logprobs(model, [], [], tok.pad_token_id)


def test_lora_wrapped_policy_agrees_and_keeps_checkpoint_defaults_out():
    """Participants may train LoRA adapters: the PEFT wrapper must sample and score the same policy,
    and the checkpoint defaults it hides are those of the wrapped transformers model."""
    from peft import LoraConfig, get_peft_model

    base, tok = build_untrained("tiny-qwen2", seed=0)
    lora = LoraConfig(task_type="CAUSAL_LM", r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = get_peft_model(base, lora)
    base.generation_config.top_k = 1  # would make every sample of a prompt identical if it leaked
    groups = generate(model, tok, PROMPTS, num_samples=3, max_new_tokens=6, seed=0)
    assert base.generation_config.top_k == 1
    assert all(len({c.token_ids for c in group}) > 1 for group in groups)
    flat = [c for group in groups for c in group]
    prompt_ids = [render_prompt_ids(tok, p) for p in PROMPTS for _ in range(3)]
    with torch.inference_mode():
        logp, _ = sequence_logprobs(model, prompt_ids, [c.token_ids for c in flat], tok.pad_token_id)
    for row, completion in enumerate(flat):
        assert logp[row].sum().item() == pytest.approx(completion.logprob_sum, abs=1e-4)
