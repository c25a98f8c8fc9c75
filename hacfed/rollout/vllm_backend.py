"""Optional vLLM rollout engine (GPU) with the same `generate` call as `hacfed.rollout.hf`.

UNTESTED in CI: it needs a CUDA GPU and `pip install hacfed[vllm]`; tests/integration/test_vllm.py
(marked `gpu` and `vllm`) checks it against the transformers engine where both are available.

vLLM serves the weights it loaded from `checkpoint_dir` (a `save_pretrained` folder). It does not
follow in-memory updates of a transformers model: after each policy update save the checkpoint and
call `reload()`, or the samples come from a stale policy and every importance ratio is wrong.

Sampling matches the federation's contract: temperature/top_p as given, top-k off (-1, accepted as
"disabled" by every vLLM >= 0.8), no penalties, one log-prob per sampled token (`logprobs=0`).
vLLM's V1 engine reports those log-probs from the raw logits, i.e. log π at temperature 1, while the
transformers engine and the trainer use the tempered policy at the sampling temperature; the legacy
V0 engine reports them after temperature scaling. So this engine samples at temperature 1 only
(another temperature is refused). Only the tokenizer's EOS stops a sample (`ignore_eos` plus
`stop_token_ids`), so extra EOS ids listed in a checkpoint's generation config do not cut samples
the transformers engine would continue.

dtype "auto" means the checkpoint's own dtype (its config.json), not vLLM's "auto", which serves a
float32 checkpoint in float16: the published log-prob summaries would then come from a rounded
copy of the policy the trainer scores in float32. `reload()` shuts the old engine down and frees
its GPU memory before the new one allocates its share (`gpu_memory_utilization` is a fraction of
the whole GPU, so two live engines of 0.5 do not fit).

    engine = VllmRollout("checkpoints/tiny-qwen2")
    groups = engine.generate(None, tokenizer, prompts, num_samples=8, seed=0)
"""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from hacfed.rollout.hf import Completion, special_token_ids, validate_generate_args
from hacfed.trajectory import ChatMessage, render_prompt_ids


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(
            "the vLLM rollout engine needs vLLM and a CUDA GPU: install hacfed[vllm] "
            "(pip install 'hacfed[vllm]'), or use hacfed.rollout.hf.generate"
        ) from exc
    return vllm


_DTYPE_NAMES = {"float32": "float32", "float": "float32", "bfloat16": "bfloat16", "float16": "float16",
                "half": "float16"}


def checkpoint_dtype(config: Mapping[str, Any]) -> str | None:
    """The weights' dtype named in a transformers config.json ("dtype", or the older "torch_dtype")."""
    value = config.get("dtype", config.get("torch_dtype"))
    if not isinstance(value, str):
        return None
    return _DTYPE_NAMES.get(value.removeprefix("torch."))


def resolve_dtype(checkpoint_dir: str, dtype: str) -> str:
    """`dtype`, with "auto" replaced by the checkpoint's own dtype when its config names one."""
    if dtype != "auto":
        return dtype
    try:
        config = json.loads((Path(checkpoint_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return dtype  # vLLM reports a missing or broken checkpoint itself
    if not isinstance(config, dict):
        return dtype
    return checkpoint_dtype(config) or dtype


def shutdown_engine(llm: Any) -> None:
    """Stop a vLLM engine's worker process (the V1 engine core), which holds its GPU memory."""
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    shutdown = getattr(core, "shutdown", None)
    if callable(shutdown):
        shutdown()


def _free_cuda_cache() -> None:
    gc.collect()  # an engine running in this process (V0, or V1 in-process) is freed here
    try:
        import torch
    except ImportError:
        return
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class VllmRollout:
    """A vLLM engine over one checkpoint directory; see the module docstring for its contract."""

    def __init__(self, checkpoint_dir: str, *, dtype: str = "auto", gpu_memory_utilization: float = 0.5,
                 enforce_eager: bool = False, **engine_kwargs: Any) -> None:
        self._vllm = _import_vllm()
        self._dtype = dtype
        self._engine_args = dict(
            model=str(checkpoint_dir), dtype=resolve_dtype(str(checkpoint_dir), dtype),
            gpu_memory_utilization=gpu_memory_utilization,
            enforce_eager=enforce_eager, **engine_kwargs,
        )
        self._llm = self._vllm.LLM(**self._engine_args)

    def reload(self, checkpoint_dir: str | None = None) -> None:
        """Rebuild the engine from `checkpoint_dir` (default: the same folder, re-read from disk)."""
        if checkpoint_dir is not None:
            self._engine_args["model"] = str(checkpoint_dir)
        self._engine_args["dtype"] = resolve_dtype(self._engine_args["model"], self._dtype)
        old, self._llm = self._llm, None
        shutdown_engine(old)
        del old
        _free_cuda_cache()
        self._llm = self._vllm.LLM(**self._engine_args)

    def _sampling_params(self, *, num_samples: int, max_new_tokens: int, temperature: float, top_p: float,
                         greedy: bool, seed: int | None, eos_id: int) -> Any:
        return self._vllm.SamplingParams(
            n=num_samples,
            temperature=0.0 if greedy else float(temperature),
            top_p=1.0 if greedy else float(top_p),
            top_k=-1,
            min_p=0.0,
            repetition_penalty=1.0,
            presence_penalty=0.0,
            frequency_penalty=0.0,
            max_tokens=max_new_tokens,
            logprobs=0,
            seed=seed,
            ignore_eos=True,
            stop_token_ids=[eos_id],
        )

    def generate(
        self,
        model: Any,
        tokenizer: Any,
        prompts: Sequence[Sequence[ChatMessage]],
        *,
        num_samples: int = 1,
        max_new_tokens: int = 16,
        temperature: float = 1.0,
        top_p: float = 1.0,
        greedy: bool = False,
        batch_size: int = 64,
        seed: int | None = None,
    ) -> list[list[Completion]]:
        """Same contract as `hacfed.rollout.hf.generate`. `model` and `batch_size` are accepted for
        signature compatibility and unused: vLLM holds its own weights and schedules its own batches."""
        validate_generate_args(num_samples, max_new_tokens, temperature, top_p, batch_size, seed)
        if not greedy and temperature != 1.0:
            raise ValueError(f"the vLLM engine samples at temperature 1 only (its log-probs are the untempered "
                             f"policy's), got {temperature!r}: use the transformers engine")
        del model, batch_size
        if not prompts:
            return []
        eos_id, _ = special_token_ids(tokenizer)
        requests = [{"prompt_token_ids": render_prompt_ids(tokenizer, messages)} for messages in prompts]
        # One seed per prompt: a shared seed would give every prompt the same random stream.
        params = [
            self._sampling_params(num_samples=num_samples, max_new_tokens=max_new_tokens, temperature=temperature,
                                  top_p=top_p, greedy=greedy, seed=None if seed is None else seed + i, eos_id=eos_id)
            for i in range(len(prompts))
        ]
        outputs = self._llm.generate(requests, params, use_tqdm=False)
        return [[_to_completion(tokenizer, sample, eos_id) for sample in request.outputs] for request in outputs]


def _to_completion(tokenizer: Any, sample: Any, eos_id: int) -> Completion:
    """vLLM CompletionOutput -> Completion, cut before the first EOS (vLLM may include it)."""
    ids = list(sample.token_ids)
    if sample.logprobs is None or len(sample.logprobs) != len(ids):
        raise RuntimeError(f"vLLM returned {len(sample.logprobs or [])} log-prob entries for {len(ids)} tokens")
    logps = [step[token].logprob for token, step in zip(ids, sample.logprobs)]
    if eos_id in ids:
        cut, finish = ids.index(eos_id), "stop"
    elif sample.finish_reason in ("stop", "length"):
        # "stop" without EOS in the ids: vLLM left the stop token out (EOS is our only stop criterion).
        cut, finish = len(ids), sample.finish_reason
    else:
        raise RuntimeError(f"vLLM sample ended with {sample.finish_reason!r}; expected 'stop' or 'length'")
    kept = tuple(ids[:cut])
    text = tokenizer.decode(list(kept), skip_special_tokens=True)
    return Completion(text, kept, tuple(float(x) for x in logps[:cut]), finish)
