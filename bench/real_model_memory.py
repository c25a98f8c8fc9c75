"""Peak memory of one training step of a real model, each memory setting against a baseline run alike.

    OMP_NUM_THREADS=1 python bench/real_model_memory.py --model smollm2 --json runs/memory.json

Each setting runs in its own child process (so one's allocations never hide in another's peak):
load the model (from a plain exported directory: the GGUF de-quantization's own peak is not the
step's), build the optimizer (and, for full fine-tuning, the frozen reference copy the KL needs),
reset the process's peak-RSS counter (Linux `clear_refs`), run one optimizer step on the same
batch of GSM8K prompts with their reference solutions as responses (prompt + response of 150-400
tokens in SmolLM2's tokenizer), and read the peak back (VmHWM). The step is the shape of hacfed's
update (one teacher-forced forward of every row, a sequence-mean policy-gradient loss, backward,
clipped AdamW step); with a token budget the rows are split by `hacfed.clients.microbatch` and the
gradients accumulated with its weights.

Settings: baseline (full fine-tuning, float32, one forward/backward of the whole minibatch, as the
update does today), then LoRA (r 8, all linear layers), activation checkpointing, the token budget,
and their combination. Printed: each setting's peak RSS during the step, its peak above the RSS
before the step, and both as a ratio to the baseline measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SETTINGS = {
    "baseline": {"finetune": "full", "checkpointing": False, "token_budget": None},
    "lora": {"finetune": "lora", "checkpointing": False, "token_budget": None},
    "checkpointing": {"finetune": "full", "checkpointing": True, "token_budget": None},
    "token-budget": {"finetune": "full", "checkpointing": False, "token_budget": 1024},
    "lora+checkpointing+budget": {"finetune": "lora", "checkpointing": True, "token_budget": 1024},
}


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def run_one(model_dir: str, setting: dict, rows: int) -> dict:
    """One setting's step in this process; returns its peak and its rise above the pre-step RSS (MiB)."""
    import copy

    import torch

    from hacfed.clients.microbatch import accumulation_weights, split_by_tokens
    from hacfed.models.loading import load_model
    from hacfed.models.memory import MemoryPlan, apply_memory_plan
    from hacfed.tasks.registry import load_task
    from hacfed.trajectory import render_prompt_ids

    torch.manual_seed(0)
    loaded = load_model(model_dir, progress=False)
    model, tok = loaded.model, loaded.tokenizer
    apply_memory_plan(model, MemoryPlan(setting["finetune"], setting["checkpointing"], "float32", 0))
    reference = None
    if setting["finetune"] == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear"))
    else:
        reference = copy.deepcopy(model).eval()  # the frozen reference policy full fine-tuning keeps
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)
    task = load_task({"kind": "gsm8k"})
    problems = list(task.train_problems())[:rows]
    batch = []
    for p in problems:
        prompt = render_prompt_ids(tok, p.messages)
        response = tok(p.solution, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        batch.append((prompt, response))
    lengths = [len(a) + len(b) for a, b in batch]
    advantages = torch.randn(rows)
    groups = split_by_tokens(lengths, setting["token_budget"]) if setting["token_budget"] else [list(range(rows))]
    weights = accumulation_weights(groups, lengths, "sequence")

    before = _rss_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    t0 = time.perf_counter()
    model.train()
    for group, weight in zip(groups, weights):
        width = max(lengths[i] for i in group)
        ids = torch.full((len(group), width), tok.pad_token_id)
        mask = torch.zeros_like(ids)
        resp = torch.zeros_like(ids, dtype=torch.float32)
        for r, i in enumerate(group):
            prompt, response = batch[i]
            seq = prompt + response
            ids[r, : len(seq)] = torch.tensor(seq)
            mask[r, : len(seq)] = 1
            resp[r, len(prompt): len(seq)] = 1
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        token_mask = resp[:, 1:]
        seq_logp = (logp * token_mask).sum(1) / token_mask.sum(1)
        loss = -(advantages[group] * seq_logp).mean() * weight
        loss.backward()
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    step_s = time.perf_counter() - t0
    peak = _rss_kib("VmHWM")
    task.close()
    del reference
    return {"peak_mib": peak / 1024, "step_rise_mib": (peak - before) / 1024, "before_mib": before / 1024,
            "microbatches": len(groups), "tokens": sum(lengths), "step_s": round(step_s, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2", help="a model spec; exported to a plain directory first")
    parser.add_argument("--rows", type=int, default=8, help="sequences in the minibatch")
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", nargs=2, metavar=("DIR", "SETTING"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_one(args.child[0], SETTINGS[args.child[1]], args.rows)))
        return
    from hacfed.models.export import export_model

    names = args.settings.split(",")
    if names[0] != "baseline":
        raise SystemExit("the first setting must be baseline (every ratio is against it)")
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(export_model(args.model, Path(tmp) / "model").directory)
        results = {}
        for name in names:
            out = subprocess.run([sys.executable, __file__, "--rows", str(args.rows), "--child", model_dir, name],
                                 check=True, capture_output=True, text=True).stdout
            results[name] = json.loads(out.strip().splitlines()[-1])
            base = results["baseline"]
            r = results[name]
            r["peak_ratio"] = round(r["peak_mib"] / base["peak_mib"], 3)
            r["rise_ratio"] = round(r["step_rise_mib"] / base["step_rise_mib"], 3)
            print(f"{name:<28} peak {r['peak_mib']:7.0f} MiB ({r['peak_ratio']:.2f}x)  step rise "
                  f"{r['step_rise_mib']:7.0f} MiB ({r['rise_ratio']:.2f}x)  {r['microbatches']} microbatch(es), "
                  f"{r['tokens']} tokens, {r['step_s']} s", flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"model": args.model, "rows": args.rows, "settings": results}, indent=1))


if __name__ == "__main__":
    main()
