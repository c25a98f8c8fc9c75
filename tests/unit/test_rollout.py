"""The transformers rollout engine: sampling contract, determinism, stops, grouping, evaluation."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch

from hacfed.models.zoo import build_untrained
from hacfed.rollout import Completion, evaluate_accuracy, generate
from hacfed.rollout.hf import fit_to_context, generation_config
from hacfed.tasks.base import Problem, Verdict
from hacfed.trajectory import ChatMessage, render_prompt_ids
from tests.unit.test_logprobs import PROMPTS, eos_bias


@pytest.fixture(scope="module")
def llama():
    return build_untrained("tiny-llama", seed=0)


@pytest.fixture(scope="module")
def gpt2():
    return build_untrained("tiny-gpt2", seed=0)


def _ids(groups):
    return [[c.token_ids for c in group] for group in groups]


def test_completion_validates_and_sums():
    c = Completion("ab", (5, 6), (-0.5, -0.25), "stop")
    assert c.logprob_sum == pytest.approx(-0.75)
    with pytest.raises(ValueError, match="finish_reason"):
        Completion("", (), (), "eos")
    with pytest.raises(ValueError, match="2 token ids but 1 log-probs"):
        Completion("ab", (5, 6), (-0.5,), "length")


def test_training_sampling_config_has_no_truncation():
    cfg = generation_config(max_new_tokens=4, temperature=1.0, top_p=1.0, greedy=False, eos_id=2, pad_id=0)
    assert cfg.do_sample is True
    assert cfg.top_k == 0  # None would let transformers fill in its default top_k=50
    assert cfg.top_p == 1.0 and cfg.temperature == 1.0
    assert cfg.output_logits is False and cfg.num_beams == 1  # log-probs are kept per step (StepLogprobs)


def test_sampling_reaches_beyond_the_top_50_tokens(gpt2):
    """A random GPT-2 spreads its next-token distribution over 258 tokens; 150 first-token draws
    (seeded) hit 104 distinct tokens (top-50 mass is only 0.27). Any top-k=50 truncation would cap this at 50."""
    model, tok = gpt2
    groups = generate(model, tok, PROMPTS[:1], num_samples=150, max_new_tokens=1, seed=0, batch_size=150)
    first_tokens = {c.token_ids[0] for c in groups[0] if c.token_ids}
    assert len(first_tokens) > 60


def test_checkpoint_generation_defaults_do_not_leak(gpt2):
    """Sampling defaults stored with a checkpoint (top_k, repetition penalty, ...) must not change
    what `generate` samples; the checkpoint's config is restored afterwards."""
    model, tok = gpt2
    clean = generate(model, tok, PROMPTS, num_samples=2, max_new_tokens=6, seed=5)
    gen = model.generation_config
    saved = gen.to_dict()
    gen.top_k, gen.repetition_penalty, gen.no_repeat_ngram_size, gen.min_new_tokens = 3, 5.0, 1, 6
    try:
        polluted = generate(model, tok, PROMPTS, num_samples=2, max_new_tokens=6, seed=5)
        assert model.generation_config is gen and gen.top_k == 3  # restored, untouched
    finally:
        model.generation_config = type(gen).from_dict(saved)
    assert _ids(polluted) == _ids(clean)


def test_greedy_is_deterministic_and_independent_of_batch_size(llama):
    model, tok = llama
    one_batch = generate(model, tok, PROMPTS, num_samples=2, max_new_tokens=8, greedy=True, batch_size=64)
    # 6 sequences as 4 + 2: different batch mates, different padding
    split = generate(model, tok, PROMPTS, num_samples=2, max_new_tokens=8, greedy=True, batch_size=4)
    again = generate(model, tok, PROMPTS, num_samples=2, max_new_tokens=8, greedy=True, batch_size=64)
    assert _ids(one_batch) == _ids(again) == _ids(split)
    for group_a, group_b in zip(one_batch, split):
        assert group_a[0].token_ids == group_a[1].token_ids  # greedy copies are identical
        for a, b in zip(group_a, group_b):
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_seeded_sampling_is_reproducible_and_leaves_global_rng_alone(llama):
    model, tok = llama
    torch.manual_seed(123)
    state = torch.get_rng_state()
    a = generate(model, tok, PROMPTS, num_samples=3, max_new_tokens=6, seed=7)
    assert torch.equal(torch.get_rng_state(), state)
    b = generate(model, tok, PROMPTS, num_samples=3, max_new_tokens=6, seed=7)
    c = generate(model, tok, PROMPTS, num_samples=3, max_new_tokens=6, seed=8)
    assert _ids(a) == _ids(b)
    assert _ids(a) != _ids(c)
    # samples of one prompt differ from each other (they are not copies of one draw)
    assert len({comp.token_ids for comp in a[1]}) > 1


def test_groups_are_prompt_by_sample(llama):
    model, tok = llama
    groups = generate(model, tok, PROMPTS, num_samples=5, max_new_tokens=3, seed=0, batch_size=4)
    assert [len(g) for g in groups] == [5, 5, 5]
    assert generate(model, tok, [], num_samples=5) == []


def test_finish_reasons_and_eos_exclusion(llama):
    model, tok = llama
    eos, max_new = tok.eos_token_id, 8
    with eos_bias(model, eos, 2.5):
        groups = generate(model, tok, PROMPTS, num_samples=12, max_new_tokens=max_new, seed=3)
    flat = [c for g in groups for c in g]
    stops = [c for c in flat if c.finish_reason == "stop"]
    lengths = [c for c in flat if c.finish_reason == "length"]
    assert stops and lengths
    assert all(len(c.token_ids) == max_new for c in lengths)
    assert all(len(c.token_ids) < max_new for c in stops)  # EOS itself took the last step at most
    assert all(eos not in c.token_ids and len(c.logprobs) == len(c.token_ids) for c in flat)
    # An overwhelming EOS logit: greedy stops at once with an empty response.
    with eos_bias(model, eos, 1e4):
        (only,), = generate(model, tok, PROMPTS[:1], max_new_tokens=4, greedy=True)
    assert only == Completion("", (), (), "stop")


def test_text_is_the_decoded_token_ids(llama):
    """The char tokenizer maps one token to one character; specials are skipped in the text."""
    model, tok = llama
    groups = generate(model, tok, PROMPTS, num_samples=3, max_new_tokens=12, seed=1)
    special = {i for i, added in tok.added_tokens_decoder.items() if added.special}
    for c in (c for g in groups for c in g):
        expected = "".join(tok.convert_ids_to_tokens(i) for i in c.token_ids if i not in special)
        assert c.text == expected


def test_model_mode_is_restored(llama):
    model, tok = llama
    model.train()
    try:
        generate(model, tok, PROMPTS[:1], max_new_tokens=2, seed=0)
        assert model.training
    finally:
        model.eval()


class _FirstCharTask:
    """Rewards a response iff it equals what the problem's `answer` says; records what it saw."""

    name = "stub"

    def __init__(self) -> None:
        self.seen: list[str] = []

    def verify(self, problem: Problem, response: str) -> Verdict:
        self.seen.append(response)
        return Verdict(1.0 if response == problem.answer else 0.0)


def test_evaluate_accuracy_averages_greedy_rewards(llama):
    model, tok = llama
    greedy = generate(model, tok, PROMPTS, max_new_tokens=5, greedy=True)
    answers = [greedy[0][0].text, "no", greedy[2][0].text + "no"]
    problems = [Problem(f"p{i}", tuple(m), a, "") for i, (m, a) in enumerate(zip(PROMPTS, answers))]
    task = _FirstCharTask()
    acc = evaluate_accuracy(model, tok, task, problems, max_new_tokens=5, batch_size=2)
    assert acc == pytest.approx(1 / 3)
    assert task.seen == [g[0].text for g in greedy]
    with pytest.raises(ValueError, match="at least one problem"):
        evaluate_accuracy(model, tok, task, [])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_samples=0), "num_samples"),
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(batch_size=0), "batch_size"),
        (dict(temperature=0.0), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(seed=1.5), "seed"),
    ],
)
def test_bad_arguments_are_rejected(llama, kwargs, message):
    model, tok = llama
    with pytest.raises(ValueError, match=message):
        generate(model, tok, PROMPTS, **kwargs)


def test_responses_are_cut_at_the_models_context(llama):
    """A prompt near the context gets the room left (finish "length"), one past it keeps its end and
    an eighth of the context to answer in; the other prompts keep the full budget, every group is whole."""
    model, tok = llama
    limit = model.config.max_position_embeddings
    short = [ChatMessage("user", "12+34=")]
    base = len(render_prompt_ids(tok, [ChatMessage("user", "")]))
    near = [ChatMessage("user", "7" * (limit - base - 3))]  # the character tokenizer: 3 positions left
    over = [ChatMessage("user", "7" * (limit + 5))]
    assert len(render_prompt_ids(tok, near)) == limit - 3
    groups = generate(model, tok, [short, near, over], num_samples=2, max_new_tokens=100, seed=0)
    assert [len(g) for g in groups] == [2, 2, 2]
    for cap, group in ((3, groups[1]), (limit // 8, groups[2])):
        for c in group:
            assert len(c.token_ids) <= cap and (c.finish_reason == "stop" or len(c.token_ids) == cap)
    alone = generate(model, tok, [short], num_samples=2, max_new_tokens=100, seed=0)
    assert _ids(alone) == _ids(groups[:1])
    assert fit_to_context([[1] * 10, [1] * 600, [1] * 510], 100, 512) == [(10, 100), (448, 64), (510, 2)]
    assert fit_to_context([[1] * 10], 100, None) == [(10, 100)]


def test_prompts_render_with_the_chat_template(llama):
    """Greedy output depends on the rendered prompt: a raw (template-free) prompt differs."""
    model, tok = llama
    msgs = [ChatMessage("user", "12+34=")]
    via_template = generate(model, tok, [msgs], max_new_tokens=6, greedy=True)[0][0]
    rendered = tok.apply_chat_template([m.as_dict() for m in msgs], tokenize=False, add_generation_prompt=True)
    ids = torch.tensor([tok(rendered, add_special_tokens=False)["input_ids"]])
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=6,
                             do_sample=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    direct = out[0, ids.shape[1]:].tolist()
    if tok.eos_token_id in direct:
        direct = direct[: direct.index(tok.eos_token_id)]
    assert list(via_template.token_ids) == direct


# --- vLLM backend, against a stand-in `vllm` module (real vLLM: tests/integration/test_vllm.py) ---


class _FakeLLM:
    """Records engine/sampling arguments; every sample: tokens 40, 41, then EOS for "stop"."""

    def __init__(self, **engine_args):
        self.engine_args = engine_args
        self.calls = []

    def generate(self, requests, params, use_tqdm):
        self.calls.append((requests, params))
        eos = 2
        outputs = []
        for p in params:
            samples = []
            for i in range(p.kw["n"]):
                ids = [40, 41, eos] if i % 2 == 0 else [40, 41, 42][: p.kw["max_tokens"]]
                logprobs = [{t: SimpleNamespace(logprob=-0.5 * (k + 1))} for k, t in enumerate(ids)]
                samples.append(SimpleNamespace(token_ids=ids, logprobs=logprobs,
                                               finish_reason="stop" if eos in ids else "length"))
            outputs.append(SimpleNamespace(outputs=samples))
        return outputs


class _FakeSamplingParams:
    def __init__(self, **kw):
        self.kw = kw


def test_vllm_backend_contract_with_fake_engine(monkeypatch, llama):
    from hacfed.rollout.vllm_backend import VllmRollout

    _, tok = llama
    assert tok.eos_token_id == 2  # the fake engine's EOS
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(LLM=_FakeLLM, SamplingParams=_FakeSamplingParams))
    engine = VllmRollout("ckpt", dtype="float32")
    groups = engine.generate(None, tok, PROMPTS[:2], num_samples=2, max_new_tokens=3, seed=10)
    (requests, params), = engine._llm.calls
    assert requests[0]["prompt_token_ids"] == render_prompt_ids(tok, PROMPTS[0])
    kw = params[1].kw
    assert (kw["top_k"], kw["top_p"], kw["temperature"], kw["logprobs"], kw["n"]) == (-1, 1.0, 1.0, 0, 2)
    assert kw["stop_token_ids"] == [2] and kw["ignore_eos"] and kw["repetition_penalty"] == 1.0
    assert [p.kw["seed"] for p in params] == [10, 11]  # one stream per prompt
    stop, length = groups[0]
    assert stop == Completion(tok.decode([40, 41]), (40, 41), (-0.5, -1.0), "stop")  # EOS cut off
    assert length == Completion(tok.decode([40, 41, 42]), (40, 41, 42), (-0.5, -1.0, -1.5), "length")
    greedy = engine.generate(None, tok, PROMPTS[:1], greedy=True)
    assert engine._llm.calls[-1][1][0].kw["temperature"] == 0.0 and len(greedy[0]) == 1


def test_vllm_backend_missing_dependency_is_a_clear_error(monkeypatch):
    from hacfed.rollout.vllm_backend import VllmRollout

    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    with pytest.raises(ImportError, match=r"install hacfed\[vllm\]"):
        VllmRollout("ckpt")
