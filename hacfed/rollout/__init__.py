"""Rollout engine: sampling with per-token policy log-probs, and teacher-forced scoring.

`hacfed.rollout.hf.generate` (transformers) is the default engine; `hacfed.rollout.vllm_backend`
offers the same call on GPUs with vLLM. `hacfed.rollout.logprobs.sequence_logprobs` recomputes
log-probs for the trainer; `hacfed.tools.gpu_check` checks both engines against it on a GPU
(scripts/gpu_check.sh). Importing this package pulls in torch but never vLLM.
"""

from hacfed.rollout.greedy_eval import evaluate_accuracy
from hacfed.rollout.hf import Completion, generate
from hacfed.rollout.logprobs import sequence_logprobs

__all__ = ["Completion", "evaluate_accuracy", "generate", "sequence_logprobs"]
