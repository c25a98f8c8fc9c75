"""GPU check of the rollout engines: vLLM's and transformers' log-prob summaries against teacher forcing.

    python -m hacfed.tools.gpu_check --out runs/gpu-check.json     # scripts/gpu_check.sh runs this

A participant publishes `source_logp_sum` (the sum of log π over a sample's tokens) as the rollout
engine reported it, and the other labs' importance ratios are built on it; the trainer recomputes
log π by teacher forcing (`hacfed.rollout.logprobs.sequence_logprobs`). On a GPU the two come from
different kernels (vLLM's paged attention and sampler vs. a transformers forward), so this check
samples with each engine on one real model and teacher-forces the very same tokens with
transformers on the same GPU:

  * vLLM rollout sums vs. HF teacher forcing (needs vLLM),
  * HF `generate` rollout sums (from its raw step logits) vs. HF teacher forcing,

each within a tolerance that grows with the sample's length (`Tolerance`), and it records rollout
tokens/s of both engines. It writes a JSON report and prints a short summary; the exit code is 0
only when every comparison that ran passed. Where no CUDA device is visible it prints
"no GPU: skipped" and exits 0.

The comparison and the summary are pure functions (unit-tested on CPU); `run_check` needs a GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

SKIP_LINE = "no GPU: skipped"


@dataclass(frozen=True)
class Tolerance:
    """|rollout sum − teacher-forced sum| may reach abs_per_sequence + per_token · tokens.

    Per-token errors of two float kernels add up along a sample, hence the length term;
    `max_fail_fraction` of the sequences may exceed it (0: none may)."""

    abs_per_sequence: float
    per_token: float
    max_fail_fraction: float = 0.0

    def __post_init__(self) -> None:
        for name in ("abs_per_sequence", "per_token"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"Tolerance.{name} must be a finite number >= 0, got {value!r}")
        if not 0 <= self.max_fail_fraction < 1:
            raise ValueError(f"Tolerance.max_fail_fraction must be in [0, 1), got {self.max_fail_fraction!r}")

    def limit(self, tokens: int) -> float:
        return self.abs_per_sequence + self.per_token * tokens


# float32 kernels agree to ~1e-5 per token; half precision rounds every logit (~1e-2 per token).
DEFAULT_TOLERANCES: Mapping[str, Tolerance] = {
    "float32": Tolerance(abs_per_sequence=0.01, per_token=1e-3),
    "bfloat16": Tolerance(abs_per_sequence=0.1, per_token=0.03, max_fail_fraction=0.02),
    "float16": Tolerance(abs_per_sequence=0.05, per_token=0.015, max_fail_fraction=0.02),
}


def default_tolerance(dtype: str) -> Tolerance:
    try:
        return DEFAULT_TOLERANCES[dtype]
    except KeyError:
        raise ValueError(
            f"no default tolerance for dtype {dtype!r}; choose one of {sorted(DEFAULT_TOLERANCES)}"
        ) from None


@dataclass(frozen=True)
class Comparison:
    """One engine's rollout sums against teacher forcing of the same tokens."""

    name: str
    sequences: int
    tokens: int
    max_abs_diff: float
    mean_abs_diff: float
    max_abs_diff_per_token: float
    failures: int
    worst: int  # index of the sequence with the largest excess over its limit
    passed: bool


def compare_sums(name: str, rollout_sums: Sequence[float], teacher_sums: Sequence[float],
                 token_counts: Sequence[int], tol: Tolerance) -> Comparison:
    """Compare per-sequence log-prob sums; a non-finite value always fails its sequence."""
    n = len(rollout_sums)
    if n == 0 or len(teacher_sums) != n or len(token_counts) != n:
        raise ValueError(
            f"{name}: need the same number (>= 1) of rollout sums, teacher sums and token counts, got "
            f"{len(rollout_sums)}, {len(teacher_sums)} and {len(token_counts)}"
        )
    diffs: list[float] = []
    excess: list[float] = []
    for a, b, t in zip(rollout_sums, teacher_sums, token_counts):
        if t < 0:
            raise ValueError(f"{name}: token counts must be >= 0, got {t}")
        d = abs(float(a) - float(b)) if math.isfinite(a) and math.isfinite(b) else math.inf
        diffs.append(d)
        excess.append(d - tol.limit(t))
    failures = sum(e > 0 for e in excess)
    finite = [d for d in diffs if math.isfinite(d)]
    per_token = [d / max(t, 1) for d, t in zip(diffs, token_counts)]
    return Comparison(
        name=name, sequences=n, tokens=int(sum(token_counts)),
        max_abs_diff=max(diffs), mean_abs_diff=(math.fsum(finite) / len(finite)) if finite else math.inf,
        max_abs_diff_per_token=max(per_token), failures=failures,
        worst=max(range(n), key=lambda i: excess[i]),
        passed=failures <= tol.max_fail_fraction * n,
    )


def tokens_per_second(token_counts: Sequence[int], seconds: float) -> float:
    if not seconds > 0:
        raise ValueError(f"seconds must be > 0, got {seconds!r}")
    return sum(token_counts) / seconds


@dataclass
class Report:
    """What the check writes as JSON (`asdict`)."""

    model: str
    dtype: str
    device: str
    settings: dict[str, Any]
    tolerance: dict[str, float]
    comparisons: list[dict[str, Any]] = field(default_factory=list)
    tokens_per_s: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # part -> why it was left out on request
    missing: dict[str, str] = field(default_factory=dict)  # part -> why it could not run (a failure)
    environment: dict[str, str] = field(default_factory=dict)  # library versions the check ran with
    passed: bool = False

    def add(self, comparison: Comparison) -> None:
        self.comparisons.append(asdict(comparison))

    def finish(self) -> "Report":
        self.passed = bool(self.comparisons) and all(c["passed"] for c in self.comparisons) and not self.missing
        return self


def summary_lines(report: Mapping[str, Any]) -> list[str]:
    """The printed summary: one line per comparison and per engine's speed, then the verdict."""
    lines = [f"gpu check: {report['model']} ({report['dtype']}) on {report['device']}"]
    env = report.get("environment") or {}
    if env:
        lines.append("  " + ", ".join(f"{k} {v}" for k, v in sorted(env.items())))
    for c in report["comparisons"]:
        verdict = "ok" if c["passed"] else "FAIL"
        lines.append(
            f"  {c['name']}: {verdict}: {c['sequences']} samples, {c['tokens']} tokens, |diff| max "
            f"{c['max_abs_diff']:.2e} mean {c['mean_abs_diff']:.2e} (max per token {c['max_abs_diff_per_token']:.2e}), "
            f"{c['failures']} over tolerance"
        )
    for engine, rate in sorted(report["tokens_per_s"].items()):
        lines.append(f"  rollout {engine}: {rate:.0f} tokens/s")
    for part, why in sorted(report["skipped"].items()):
        lines.append(f"  {part}: skipped: {why}")
    for part, why in sorted(report.get("missing", {}).items()):
        lines.append(f"  {part}: could not run: {why}")
    lines.append("gpu check: PASSED" if report["passed"] else "gpu check: FAILED")
    return lines


# --- the part that needs a GPU ---------------------------------------------------------------


@dataclass(frozen=True)
class CheckConfig:
    model: str = "smollm2"
    dtype: str = "float32"
    prompts: int = 32
    samples: int = 4
    max_new_tokens: int = 96
    hf_batch_size: int = 64
    seed: int = 0
    vllm: bool = True
    gpu_memory_utilization: float = 0.3
    enforce_eager: bool = False


def _prompts(n: int) -> list[Any]:
    from hacfed.tasks.arithmetic import ArithmeticTask

    return [p.messages for p in ArithmeticTask().eval_problems()[:n]]


def _teacher_sums(model: Any, tokenizer: Any, prompts: Sequence[Any], completions: Sequence[Any],
                  batch: int) -> list[float]:
    import torch

    from hacfed.rollout.logprobs import sequence_logprobs
    from hacfed.trajectory import render_prompt_ids

    out: list[float] = []
    with torch.inference_mode():
        for start in range(0, len(completions), batch):
            chunk = list(range(start, min(start + batch, len(completions))))
            # An empty response has sum 0 on both sides; sequence_logprobs still scores it (mask False).
            logp, _ = sequence_logprobs(model, [render_prompt_ids(tokenizer, prompts[i]) for i in chunk],
                                        [completions[i].token_ids for i in chunk], tokenizer.pad_token_id)
            out.extend(float(x) for x in logp.double().sum(dim=1).cpu())
    return out


def _versions() -> dict[str, str]:
    import platform

    import torch
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__,
            "cuda": str(torch.version.cuda), "transformers": transformers.__version__}


def _flat(groups: Sequence[Sequence[Any]], prompts: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    flat = [c for g in groups for c in g]
    owners = [prompts[i] for i, g in enumerate(groups) for _ in g]
    return flat, owners


def run_check(cfg: CheckConfig, tol: Tolerance) -> Report:
    """Sample with HF (and vLLM) on CUDA, teacher-force the same tokens, time both engines."""
    import torch

    from hacfed.models.loading import load_model
    from hacfed.rollout.hf import generate

    loaded = load_model(cfg.model, device="cuda", dtype=cfg.dtype, progress=False)
    model, tok = loaded.model, loaded.tokenizer
    model.eval()
    report = Report(model=cfg.model, dtype=cfg.dtype, device=torch.cuda.get_device_name(0),
                    settings=asdict(cfg), tolerance=asdict(tol), environment=_versions())
    prompts = _prompts(cfg.prompts)
    kwargs = dict(num_samples=cfg.samples, max_new_tokens=cfg.max_new_tokens, seed=cfg.seed)

    generate(model, tok, prompts[:2], num_samples=2, max_new_tokens=8, seed=cfg.seed)  # CUDA warm-up
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    groups = generate(model, tok, prompts, batch_size=cfg.hf_batch_size, **kwargs)
    torch.cuda.synchronize()
    hf_s = time.perf_counter() - t0
    flat, owners = _flat(groups, prompts)
    counts = [len(c.token_ids) for c in flat]
    report.tokens_per_s["hf"] = tokens_per_second(counts, hf_s)
    report.add(compare_sums("hf rollout vs hf teacher forcing", [c.logprob_sum for c in flat],
                            _teacher_sums(model, tok, owners, flat, cfg.hf_batch_size), counts, tol))

    if not cfg.vllm:
        report.skipped["vllm"] = "--hf-only"
        return report.finish()
    try:
        import vllm  # noqa: F401

        from hacfed.rollout.vllm_backend import VllmRollout
    except ImportError:
        report.missing["vllm"] = "vLLM is not installed (scripts/gpu_check.sh --install-vllm, or --hf-only)"
        return report.finish()
    with tempfile.TemporaryDirectory(prefix="hacfed-gpu-check-") as folder:
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
        engine = VllmRollout(folder, dtype=cfg.dtype, gpu_memory_utilization=cfg.gpu_memory_utilization,
                             enforce_eager=cfg.enforce_eager, max_model_len=1024)
        engine.generate(None, tok, prompts[:2], num_samples=2, max_new_tokens=8, seed=cfg.seed)  # warm-up
        t0 = time.perf_counter()
        vgroups = engine.generate(None, tok, prompts, **kwargs)
        vllm_s = time.perf_counter() - t0
    vflat, vowners = _flat(vgroups, prompts)
    vcounts = [len(c.token_ids) for c in vflat]
    report.tokens_per_s["vllm"] = tokens_per_second(vcounts, vllm_s)
    report.add(compare_sums("vllm rollout vs hf teacher forcing", [c.logprob_sum for c in vflat],
                            _teacher_sums(model, tok, vowners, vflat, cfg.hf_batch_size), vcounts, tol))
    return report.finish()


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    d = CheckConfig()
    ap = argparse.ArgumentParser(
        prog="python -m hacfed.tools.gpu_check", allow_abbrev=False, description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--model", default=d.model, help=f"model spec for load_model (default {d.model})")
    ap.add_argument("--dtype", default=d.dtype, choices=sorted(DEFAULT_TOLERANCES), help=f"default {d.dtype}")
    ap.add_argument("--prompts", type=int, default=d.prompts, help=f"default {d.prompts}")
    ap.add_argument("--samples", type=int, default=d.samples, help=f"samples per prompt (default {d.samples})")
    ap.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens, help=f"default {d.max_new_tokens}")
    ap.add_argument("--hf-only", action="store_true", help="skip the vLLM part")
    ap.add_argument("--eager", action="store_true", help="vLLM without CUDA graphs (faster start, slower decode)")
    ap.add_argument("--out", default="runs/gpu-check.json", help="JSON report (default runs/gpu-check.json)")
    args = ap.parse_args(argv)
    for name in ("prompts", "samples", "max_new_tokens"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not cuda_available():
        print(SKIP_LINE)
        return 0
    cfg = CheckConfig(model=args.model, dtype=args.dtype, prompts=args.prompts, samples=args.samples,
                      max_new_tokens=args.max_new_tokens, vllm=not args.hf_only, enforce_eager=args.eager)
    report = asdict(run_check(cfg, default_tolerance(args.dtype)))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print("\n".join(summary_lines(report)))
    print(f"gpu check: report written to {out}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
