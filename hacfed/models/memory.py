"""Loading-side memory choices for a participant's model: full fine-tuning or LoRA, activation
(gradient) checkpointing, and the weights' dtype, decided from the model's size and the device.

    plan = memory_plan(parameters=135_000_000, device="cpu")   # full FT, no checkpointing, float32
    plan = memory_plan(parameters=1_500_000_000, device="cuda", bf16=True)   # LoRA, checkpointing, bf16

Why these thresholds (bytes per parameter of the model's training state, fp32):
  * full fine-tuning holds the weights (4), their gradients (4), AdamW's two moments (8) and the
    frozen reference policy for the KL term (4): 20 B/parameter, 2.7 GB at 135M and 30 GB at 1.5B
    before any activation. With LoRA the reference is the same model with the adapter disabled
    and only the adapter has gradients and moments: about 4 B/parameter.
  * LORA_ABOVE = 300M parameters: full fine-tuning's 20 B/parameter is then 6 GB, the most we
    expect a lab's laptop or a 16 GB GPU (with rollouts' KV cache and activations beside it) to
    spare; SmolLM2-135M (2.7 GB) stays fully fine-tuned, Qwen2.5-0.5B and up get LoRA.
  * CHECKPOINT_ABOVE = 300M parameters: activations grow with layers x width x tokens; above
    this size a minibatch of GSM8K-length answers (hundreds of tokens) costs more activation
    memory than the weights, and recomputing the forward costs about a third more compute.
  * bfloat16 weights only where the device computes in bf16 (a CUDA device that reports bf16
    support) and only for a frozen base (LoRA): full fine-tuning keeps fp32 weights, because Adam
    updates of 1e-6 x a weight vanish below bf16's 8-bit mantissa. CPUs keep float32.

Measured by bench/real_model_memory.py (SmolLM2-135M, one step on 6 GSM8K rows of 1,063 tokens,
CPU, peak RSS against full fine-tuning in the same run, 5.0 GB): activation checkpointing 0.81x, a
1,024-token microbatch budget 0.72x, LoRA with both 0.47x, but LoRA alone 1.10x: at this size the
adapters' extra activations outweigh the optimizer state and reference copy LoRA saves, which is
why small models stay fully fine-tuned.

A lab also bounds one training forward's activations (`microbatch_token_cap`): its microbatches
hold at most ACTIVATION_BYTES / `activation_bytes_per_token` padded tokens, whatever larger
`microbatch_tokens` its config allows. The estimate per token is what the backward keeps of each
layer (about 14 hidden-wide and 6 MLP-wide float32 vectors) plus the logits' float32 rows (logits,
their log-softmax and its gradient, ~4 x vocabulary); SmolLM2-135M: 2.9 MB a token, so 187
tokens a microbatch. Every tiny preset's cap is above the 4,096 default, so they never split
more for it.

`hacfed sim --finetune auto` (the default) and `ParticipantConfig(finetune="auto")` take the choice
from `memory_plan`; an explicit "full" or "lora" wins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

LORA_ABOVE = 300_000_000
CHECKPOINT_ABOVE = 300_000_000
FULL_FT_BYTES_PER_PARAMETER = 20  # weights 4 + gradients 4 + AdamW moments 8 + reference copy 4 (fp32)
LORA_BYTES_PER_PARAMETER = 4  # the frozen fp32 weights (the adapter's own state is ~1 % of the model)
ACTIVATION_BYTES = 512 * 2**20  # the most one training microbatch's activations may take (module docstring)

Finetune = Literal["full", "lora"]


@dataclass(frozen=True)
class MemoryPlan:
    finetune: Finetune
    gradient_checkpointing: bool
    dtype: Literal["float32", "bfloat16"]
    state_bytes: int  # the training state's estimate (see the module docstring), activations excluded


def memory_plan(parameters: int, device: str = "cpu", *, bf16: bool = False,
                finetune: Literal["auto", "full", "lora"] = "auto") -> MemoryPlan:
    """The memory choices for a model of `parameters` on `device`; bf16: whether the device
    computes in bfloat16 (`bf16_supported`). An explicit `finetune` is kept."""
    if isinstance(parameters, bool) or not isinstance(parameters, int) or parameters < 1:
        raise ValueError(f"parameters must be an int >= 1, got {parameters!r}")
    if finetune not in ("auto", "full", "lora"):
        raise ValueError(f"finetune must be 'auto', 'full' or 'lora', got {finetune!r}")
    chosen: Finetune = finetune if finetune != "auto" else ("lora" if parameters > LORA_ABOVE else "full")
    use_bf16 = bf16 and chosen == "lora" and str(device).startswith("cuda")
    per_parameter = FULL_FT_BYTES_PER_PARAMETER if chosen == "full" else LORA_BYTES_PER_PARAMETER
    if use_bf16:
        per_parameter //= 2
    return MemoryPlan(chosen, parameters > CHECKPOINT_ABOVE, "bfloat16" if use_bf16 else "float32",
                      parameters * per_parameter)


def bf16_supported(device: str) -> bool:
    """Whether `device` computes in bfloat16 (a CUDA device that says so; never a CPU here)."""
    if not str(device).startswith("cuda"):
        return False
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())


def apply_memory_plan(model: Any, plan: MemoryPlan) -> None:
    """Convert the weights to the plan's dtype and turn on activation checkpointing when it says
    so (it acts in training mode, where the update computes its loss)."""
    import torch

    if plan.dtype == "bfloat16":
        model.to(torch.bfloat16)
    if plan.gradient_checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        if plan.finetune == "lora":
            model.enable_input_require_grads()  # frozen embeddings: the checkpointed blocks still need a grad path


def activation_bytes_per_token(config: Any) -> int:
    """Estimated float32 bytes one padded token of a training forward keeps for the backward (module docstring)."""
    hidden = int(config.hidden_size)
    mlp = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * hidden
    return 4 * (int(config.num_hidden_layers) * (14 * hidden + 6 * int(mlp)) + 4 * int(config.vocab_size))


def microbatch_token_cap(config: Any, budget_tokens: int | None) -> int | None:
    """`budget_tokens` (a lab's microbatch_tokens; None: never split) lowered to what keeps one
    microbatch's activations within ACTIVATION_BYTES."""
    if budget_tokens is None:
        return None
    return max(1, min(budget_tokens, ACTIVATION_BYTES // activation_bytes_per_token(config)))
