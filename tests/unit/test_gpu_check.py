"""The GPU check's CPU-testable parts: tolerance logic, summary, the skip path of scripts/gpu_check.sh,
and the vLLM backend's dtype and reload handling (against a stand-in `vllm` module)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from hacfed.rollout import vllm_backend
from hacfed.tools import gpu_check as gc
from hacfed.trajectory import ChatMessage

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
TOL = gc.Tolerance(abs_per_sequence=0.01, per_token=1e-3)


# --- tolerance and comparison --------------------------------------------------------------------


def test_tolerance_grows_with_length():
    assert TOL.limit(0) == pytest.approx(0.01)
    assert TOL.limit(100) == pytest.approx(0.11)


@pytest.mark.parametrize("kwargs, message", [
    (dict(abs_per_sequence=-1.0, per_token=0.0), "abs_per_sequence must be a finite number >= 0, got -1.0"),
    (dict(abs_per_sequence=0.0, per_token=math.nan), "per_token must be a finite number >= 0"),
    (dict(abs_per_sequence=0.0, per_token=0.0, max_fail_fraction=1.0), r"max_fail_fraction must be in \[0, 1\)"),
])
def test_tolerance_refuses_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        gc.Tolerance(**kwargs)


def test_compare_passes_within_and_fails_just_outside():
    ok = gc.compare_sums("e", [-1.0, -20.0], [-1.005, -20.05], [2, 50], TOL)  # limits 0.012, 0.06
    assert ok.passed and ok.failures == 0 and ok.tokens == 52
    assert ok.max_abs_diff == pytest.approx(0.05) and ok.mean_abs_diff == pytest.approx(0.0275)
    assert ok.max_abs_diff_per_token == pytest.approx(0.0025)
    bad = gc.compare_sums("e", [-1.0, -20.0], [-1.005, -20.07], [2, 50], TOL)  # 0.07 > 0.06
    assert not bad.passed and bad.failures == 1 and bad.worst == 1


def test_compare_fail_fraction_allows_a_share_of_outliers():
    tol = gc.Tolerance(abs_per_sequence=0.0, per_token=0.0, max_fail_fraction=0.25)
    rollout = [0.0] * 8
    assert gc.compare_sums("e", rollout, [0.0] * 6 + [1.0, 1.0], [1] * 8, tol).passed  # 2 of 8
    assert not gc.compare_sums("e", rollout, [0.0] * 5 + [1.0] * 3, [1] * 8, tol).passed  # 3 of 8


def test_compare_non_finite_always_fails():
    out = gc.compare_sums("e", [-1.0, math.nan], [-1.0, -2.0], [1, 1], TOL)
    assert out.failures == 1 and out.worst == 1 and not out.passed and out.max_abs_diff == math.inf
    assert out.mean_abs_diff == 0.0  # over the finite ones


def test_compare_refuses_mismatched_lengths():
    with pytest.raises(ValueError, match="got 2, 1 and 2"):
        gc.compare_sums("e", [0.0, 0.0], [0.0], [1, 1], TOL)
    with pytest.raises(ValueError, match="token counts must be >= 0, got -1"):
        gc.compare_sums("e", [0.0], [0.0], [-1], TOL)


def test_default_tolerance_by_dtype():
    assert gc.default_tolerance("float32").per_token < gc.default_tolerance("bfloat16").per_token
    with pytest.raises(ValueError, match="no default tolerance for dtype 'int8'"):
        gc.default_tolerance("int8")


def test_tokens_per_second():
    assert gc.tokens_per_second([10, 30], 2.0) == 20.0
    with pytest.raises(ValueError, match="seconds must be > 0"):
        gc.tokens_per_second([1], 0.0)


# --- report and summary --------------------------------------------------------------------------


def _report(**kw):
    return gc.Report(model="m", dtype="float32", device="GPU X", settings={}, tolerance={}, **kw)


def test_report_passes_only_when_every_comparison_did_and_nothing_is_missing():
    good = gc.compare_sums("hf", [-1.0], [-1.0], [3], TOL)
    bad = gc.compare_sums("vllm", [-1.0], [-2.0], [3], TOL)
    r = _report()
    r.add(good)
    assert r.finish().passed
    r.skipped["vllm"] = "--hf-only"
    assert r.finish().passed  # left out on request
    r.missing["vllm"] = "not installed"
    assert not r.finish().passed
    r2 = _report()
    r2.add(good)
    r2.add(bad)
    assert not r2.finish().passed
    assert not _report().finish().passed  # nothing compared


def test_summary_lines_format():
    r = _report(tokens_per_s={"hf": 1234.4, "vllm": 9876.6})
    r.add(gc.compare_sums("vllm rollout vs hf teacher forcing", [-1.0, -2.0], [-1.001, -2.5], [4, 4], TOL))
    r.missing["x"] = "why"
    from dataclasses import asdict

    report = asdict(r.finish())
    json.dumps(report)  # the JSON the check writes
    lines = gc.summary_lines(report)
    assert lines[0] == "gpu check: m (float32) on GPU X"
    assert lines[1].startswith("  vllm rollout vs hf teacher forcing: FAIL: 2 samples, 8 tokens, |diff| max 5.00e-01")
    assert lines[1].endswith("1 over tolerance")
    assert "  rollout hf: 1234 tokens/s" in lines and "  rollout vllm: 9877 tokens/s" in lines
    assert "  x: could not run: why" in lines
    assert lines[-1] == "gpu check: FAILED"


def test_summary_names_the_library_versions():
    r = _report(environment={"torch": "2.11.0+cu130", "cuda": "13.0"})
    r.add(gc.compare_sums("hf", [-1.0], [-1.0], [1], TOL))
    from dataclasses import asdict

    lines = gc.summary_lines(asdict(r.finish()))
    assert lines[1] == "  cuda 13.0, torch 2.11.0+cu130"
    assert lines[-1] == "gpu check: PASSED"


# --- the comparison plumbing, on CPU with the transformers engine ---------------------------------


def test_hf_rollout_sums_match_teacher_forcing_on_cpu():
    """The same path run_check takes for HF, on CPU: owners line up with samples, sums agree."""
    from hacfed.models.zoo import build_untrained
    from hacfed.rollout.hf import generate

    model, tok = build_untrained("tiny-llama", seed=0)
    prompts = [(ChatMessage("user", "2+3="),), (ChatMessage("user", "40+17="),), (ChatMessage("user", "9+9="),)]
    groups = generate(model, tok, prompts, num_samples=3, max_new_tokens=10, seed=1)
    flat, owners = gc._flat(groups, prompts)
    assert owners == [p for p in prompts for _ in range(3)]
    counts = [len(c.token_ids) for c in flat]
    teacher = gc._teacher_sums(model, tok, owners, flat, batch=4)
    result = gc.compare_sums("hf", [c.logprob_sum for c in flat], teacher, counts, gc.default_tolerance("float32"))
    assert result.passed and result.sequences == 9 and result.max_abs_diff < 1e-3
    shuffled = teacher[1:] + teacher[:1]  # a misaligned pairing is caught
    assert not gc.compare_sums("hf", [c.logprob_sum for c in flat], shuffled, counts, TOL).passed


# --- entry points: skip where there is no GPU ----------------------------------------------------


def test_module_main_skips_without_cuda(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(gc, "cuda_available", lambda: False)
    out = tmp_path / "r.json"
    assert gc.main(["--out", str(out)]) == 0
    assert capsys.readouterr().out == "no GPU: skipped\n"
    assert not out.exists()


def test_module_main_refuses_bad_arguments(capsys):
    with pytest.raises(SystemExit) as exc:
        gc.main(["--prompts", "0"])
    assert exc.value.code == 2 and "--prompts must be >= 1, got 0" in capsys.readouterr().err


def _run_script(env_extra, path_dirs=()):
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env.update(env_extra)
    env["PATH"] = os.pathsep.join([*map(str, path_dirs), env.get("PATH", "")])
    return subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def _fake_nvidia_smi(folder: Path, lists_gpu: bool) -> Path:
    folder.mkdir()
    tool = folder / "nvidia-smi"
    body = 'echo "GPU 0: Fake GPU (UUID: GPU-0)"' if lists_gpu else 'echo "No devices were found"; exit 6'
    tool.write_text(f"#!/bin/sh\n{body}\n")
    tool.chmod(0o755)
    return folder


def test_script_skips_with_cuda_hidden(tmp_path):
    # Even where nvidia-smi lists a GPU, CUDA_VISIBLE_DEVICES="" hides it: skip, touch nothing.
    result = _run_script({"CUDA_VISIBLE_DEVICES": ""}, [_fake_nvidia_smi(tmp_path / "bin", lists_gpu=True)])
    assert result.returncode == 0, result.stderr
    assert result.stdout == "no GPU: skipped\n"
    assert result.stderr == ""


def test_script_skips_when_nvidia_smi_finds_no_gpu(tmp_path):
    result = _run_script({}, [_fake_nvidia_smi(tmp_path / "bin", lists_gpu=False)])
    assert result.returncode == 0, result.stderr
    assert result.stdout == "no GPU: skipped\n"


def test_script_with_hacfed_python_uses_it_without_bootstrap(tmp_path):
    # HACFED_PYTHON: the GPU host's own interpreter runs the check; no venv is made or installed into.
    # Here the stand-in nvidia-smi lists a GPU that this interpreter's CPU torch cannot see: the
    # set-up error names that interpreter (exit 2).
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    venv = tmp_path / "never-made"
    result = _run_script({"HACFED_PYTHON": sys.executable, "HACFED_VENV": str(venv)},
                         [_fake_nvidia_smi(tmp_path / "bin", lists_gpu=True)])
    assert result.returncode == 2, result.stderr
    assert f"in {sys.executable} has no CUDA" in result.stderr
    assert "[bootstrap]" not in result.stderr and not venv.exists()


def test_script_refuses_a_hacfed_python_that_cannot_import_hacfed(tmp_path):
    bare = tmp_path / "bare-python"
    bare.write_text("#!/bin/sh\nexit 1\n")
    bare.chmod(0o755)
    result = _run_script({"HACFED_PYTHON": str(bare)}, [_fake_nvidia_smi(tmp_path / "bin", lists_gpu=True)])
    assert result.returncode == 2
    assert f"HACFED_PYTHON={bare} cannot import hacfed" in result.stderr
    assert "Traceback" not in result.stderr


def test_script_skips_on_this_cpu_machine():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    result = _run_script({"CUDA_VISIBLE_DEVICES": "-1"})
    assert (result.returncode, result.stdout) == (0, "no GPU: skipped\n")


# --- vLLM backend: dtype and reload (stand-in vllm module) ---------------------------------------


def test_checkpoint_dtype_reads_either_key():
    assert vllm_backend.checkpoint_dtype({"dtype": "float32"}) == "float32"
    assert vllm_backend.checkpoint_dtype({"torch_dtype": "bfloat16"}) == "bfloat16"
    assert vllm_backend.checkpoint_dtype({"torch_dtype": "torch.float16"}) == "float16"
    assert vllm_backend.checkpoint_dtype({"dtype": None}) is None
    assert vllm_backend.checkpoint_dtype({}) is None


def test_resolve_dtype_auto_follows_the_checkpoint(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"dtype": "float32"}))
    assert vllm_backend.resolve_dtype(str(tmp_path), "auto") == "float32"  # not vLLM's fp16 for fp32
    assert vllm_backend.resolve_dtype(str(tmp_path), "bfloat16") == "bfloat16"  # explicit wins
    assert vllm_backend.resolve_dtype(str(tmp_path / "missing"), "auto") == "auto"


class _Core:
    def __init__(self, log):
        self.log = log

    def shutdown(self):
        self.log.append("shutdown")


class _FakeLLM:
    log: list = []

    def __init__(self, **engine_args):
        self.engine_args = engine_args
        self.llm_engine = SimpleNamespace(engine_core=_Core(self.log))
        self.log.append(("start", engine_args["model"], engine_args["dtype"]))


def test_reload_shuts_the_old_engine_down_before_starting_the_new(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(LLM=_FakeLLM, SamplingParams=dict))
    a, b = tmp_path / "a", tmp_path / "b"
    for folder, dtype in ((a, "float32"), (b, "bfloat16")):
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"dtype": dtype}))
    _FakeLLM.log = []
    engine = vllm_backend.VllmRollout(str(a), gpu_memory_utilization=0.2)
    engine.reload(str(b))
    assert _FakeLLM.log == [("start", str(a), "float32"), "shutdown", ("start", str(b), "bfloat16")]
    assert engine._llm.engine_args["gpu_memory_utilization"] == 0.2
