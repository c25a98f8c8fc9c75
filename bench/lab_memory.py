"""Peak RSS of a SmolLM2 lab's round, stage by stage, with the lab's code as it was and as it is.

    OMP_NUM_THREADS=1 python bench/lab_memory.py --json runs/lab_memory.json

Each setting runs in its own child process (so one's allocations never hide in another's peak):
load the model as a lab does (the GGUF, de-quantized to float32), wrap it for training (LoRA r 8 on
every linear layer, its reference the adapter disabled; or, for a full fine-tune, the frozen copy
and AdamW over every weight), sample 16 add2-words prompts x G = 4 with a 48-token budget
(`hacfed.rollout.hf.generate`, the rollout batch of 256 a lab uses), one optimizer step per half of
the 64 samples (32 rows, a sequence-mean policy-gradient loss, microbatched by the token budget
the setting names), then a greedy evaluation of 128 test problems. The peak RSS (VmHWM, reset
before each stage) is printed per stage.

Settings: `before` (microbatches of up to 4,096 tokens and the plain greedy loop, as a lab ran
before the activation cap and `hacfed.rollout.greedy_eval`), `lora` (the lab now: the capped
budget and the batched evaluator), `full` (the same with a full fine-tune, printed as a multiple
of the weights' size).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

SETTINGS = {
    "before": {"finetune": "lora", "capped": False, "batched_eval": False},
    "lora": {"finetune": "lora", "capped": True, "batched_eval": True},
    "full": {"finetune": "full", "capped": True, "batched_eval": True},
}


def _kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM back to the current RSS


def run_one(setting: dict, model_spec: str, eval_problems: int) -> dict:
    import torch

    from hacfed.clients.microbatch import accumulation_weights, split_rows
    from hacfed.clients.participant_config import ParticipantConfig
    from hacfed.clients.training import prepare_training
    from hacfed.models.loading import load_model
    from hacfed.models.memory import microbatch_token_cap
    from hacfed.rollout.greedy_eval import greedy_generate
    from hacfed.rollout.hf import generate
    from hacfed.rollout.logprobs import sequence_logprobs
    from hacfed.tasks.registry import load_task
    from hacfed.trajectory import render_prompt_ids

    stages = {}
    _reset_peak()
    loaded = load_model(model_spec, progress=False)
    model, tok = loaded.model, loaded.tokenizer
    weights_mib = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    stages["load"] = _kib("VmHWM") / 1024
    cfg = ParticipantConfig("a", model_spec, finetune=setting["finetune"], learning_rate=1e-5)
    budget = microbatch_token_cap(model.config, 4096) if setting["capped"] else 4096
    _reset_peak()
    policy, _, optimizer = prepare_training(model, cfg)
    stages["prepare"] = _kib("VmHWM") / 1024
    task = load_task({"kind": "arithmetic", "digits": 2, "operators": "+", "num_eval": eval_problems,
                      "style": "words"})
    problems = list(task.train_problems())[:16]
    _reset_peak()
    groups = generate(policy, tok, [p.messages for p in problems], num_samples=4, max_new_tokens=48,
                      batch_size=256, seed=0)
    stages["rollout"] = _kib("VmHWM") / 1024
    prompts = [render_prompt_ids(tok, p.messages) for p in problems for _ in range(4)]
    responses = [list(c.token_ids) + [tok.eos_token_id] for g in groups for c in g]
    advantages = torch.randn(len(prompts), generator=torch.Generator().manual_seed(0))
    _reset_peak()
    policy.train()
    for start in (0, 32):
        rows = list(range(start, start + 32))
        micro = split_rows([len(prompts[i]) for i in rows], [len(responses[i]) for i in rows], budget)
        weights = accumulation_weights(micro, [len(responses[i]) for i in rows], "sequence")
        for group, weight in zip(micro, weights):
            picked = [rows[i] for i in group]
            logp, mask = sequence_logprobs(policy, [prompts[i] for i in picked], [responses[i] for i in picked],
                                           tok.pad_token_id)
            seq = (logp * mask).sum(1) / mask.sum(1)
            (-(advantages[picked] * seq).mean() * weight).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    policy.eval()
    stages["update"] = _kib("VmHWM") / 1024
    held_out = [p.messages for p in list(task.eval_problems())[:eval_problems]]
    _reset_peak()
    if setting["batched_eval"]:
        greedy_generate(policy, tok, held_out, max_new_tokens=48)
    else:
        generate(policy, tok, held_out, greedy=True, max_new_tokens=48, batch_size=128)
    stages["evaluate"] = _kib("VmHWM") / 1024
    return {"stages_mib": stages, "peak_mib": max(stages.values()), "weights_mib": weights_mib,
            "microbatch_tokens": budget}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--eval-problems", type=int, default=128)
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_one(SETTINGS[args.child], args.model, args.eval_problems)))
        return
    results = {}
    for name in args.settings.split(","):
        out = subprocess.run([sys.executable, __file__, "--model", args.model, "--eval-problems",
                              str(args.eval_problems), "--child", name],
                             check=True, capture_output=True, text=True).stdout
        r = results[name] = json.loads(out.strip().splitlines()[-1])
        stages = "  ".join(f"{k} {v:5.0f}" for k, v in r["stages_mib"].items())
        ratio = f", {r['peak_mib'] / results['before']['peak_mib']:.2f}x before" if "before" in results else ""
        print(f"{name:<7} peak {r['peak_mib']:5.0f} MiB ({r['peak_mib'] / r['weights_mib']:.1f}x the weights' "
              f"{r['weights_mib']:.0f} MiB{ratio}; microbatches <= {r['microbatch_tokens']} tokens)  [{stages}]",
              flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"model": args.model, "settings": results}, indent=1))


if __name__ == "__main__":
    main()
