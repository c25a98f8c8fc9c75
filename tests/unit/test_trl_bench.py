"""bench/trl_step.py's pure parts: the two sides configured alike, the summary, the missing-TRL message."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from hacfed.clients.participant import ParticipantConfig

BENCH = Path(__file__).resolve().parents[2] / "bench" / "trl_step.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("trl_step_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def _sides(bench, s, **trl_overrides):
    trl_args = SimpleNamespace(**{**bench.trl_config_kwargs(s, "out"), **trl_overrides})
    return (bench.hacfed_hacpo(s), ParticipantConfig(**bench.hacfed_participant_kwargs(s)), trl_args,
            bench.hacfed_sampling(s))


def test_default_settings_are_the_issue_batch(bench):
    s = bench.BenchSettings()
    assert (s.prompts, s.group_size, s.updates, s.model) == (16, 8, 2, "tiny-llama")
    assert (s.completions_per_round, s.minibatch) == (128, 64)


def test_both_sides_configured_alike(bench):
    s = bench.BenchSettings(prompts=4, group_size=4, updates=4, max_new_tokens=12, rounds=2)
    hacpo, participant, trl_args, sampling = _sides(bench, s)
    assert bench.mismatches(s, hacpo, participant, trl_args, sampling) == []
    assert hacpo.mode == "gspo" and hacpo.kl_coef == 0.0
    assert (sampling.temperature, sampling.max_new_tokens) == (trl_args.temperature, trl_args.max_completion_length)
    assert trl_args.max_steps == (s.warmup + s.rounds) * s.updates  # one TRL round per hacfed round
    assert trl_args.per_device_train_batch_size * trl_args.steps_per_generation == 16


@pytest.mark.parametrize("override, named", [
    (dict(loss_type="dapo"), "sequence-mean loss"),
    (dict(importance_sampling_level="token"), "sequence-level ratio"),
    (dict(epsilon=0.2), "clip low (TRL)"),
    (dict(beta=0.04), "KL (TRL beta)"),
    (dict(steps_per_generation=1), "updates per round (TRL)"),
    (dict(num_generations=4), "G (TRL)"),
    (dict(lr_scheduler_type="linear"), "constant lr (TRL)"),
    (dict(top_k=50), "top_k off (TRL)"),
    (dict(use_vllm=True), "no vLLM (TRL)"),
    (dict(gradient_checkpointing=True), "activation checkpointing (TRL)"),  # GRPOConfig's own default
])
def test_a_differing_trl_setting_is_named(bench, override, named):
    s = bench.BenchSettings()
    problems = bench.mismatches(s, *_sides(bench, s, **override))
    assert len(problems) >= 1 and any(p.startswith(named) for p in problems), problems


def test_a_differing_hacfed_setting_is_named(bench):
    s = bench.BenchSettings()
    hacpo, participant, trl_args, sampling = _sides(bench, s)
    from hacfed.hacpo_config import HacpoConfig

    problems = bench.mismatches(s, HacpoConfig(mode="gspo"), participant, trl_args, sampling)  # kl_coef 0.001
    assert problems == ["KL (hacfed kl_coef): 0.001, want 0.0"]


@pytest.mark.parametrize("override, named", [
    (dict(temperature=0.7), "temperature (hacfed): 0.7, want 1.0"),
    (dict(top_p=0.9), "top_p (hacfed): 0.9, want 1.0"),
    (dict(max_new_tokens=32), "max tokens (hacfed): 32, want 16"),
])
def test_hacfed_sampling_unlike_trls_is_named(bench, override, named):
    # Per completion token is only like for like when both sides sample at the same temperature and budget.
    s = bench.BenchSettings()
    hacpo, participant, trl_args, sampling = _sides(bench, s)
    assert bench.mismatches(s, hacpo, participant, trl_args, dataclasses.replace(sampling, **override)) == [named]


def test_real_grpo_config_matches_when_trl_is_installed(bench, tmp_path):
    trl = pytest.importorskip("trl")  # bench-only dependency: skipped in the test environment
    s = bench.BenchSettings()
    args = trl.GRPOConfig(**bench.trl_config_kwargs(s, str(tmp_path)))
    hacpo, participant, _, sampling = _sides(bench, s)
    assert bench.mismatches(s, hacpo, participant, args, sampling) == []


def test_settings_refuse_an_uneven_split(bench):
    with pytest.raises(ValueError, match=r"prompts x group_size \(15\) must split into 2"):
        bench.BenchSettings(prompts=5, group_size=3)
    with pytest.raises(ValueError, match="rounds must be an int >= 1, got 0"):
        bench.BenchSettings(rounds=0)
    with pytest.raises(ValueError, match=r"task must be one of \['add2', 'add2-words', 'chain'\], got 'gsm8k'"):
        bench.BenchSettings(task="gsm8k")


def test_summarize_rates_and_ratios(bench):
    out = bench.summarize([1.0, 2.0, 4.0], [2.0, 2.0, 2.0], 128)
    assert out["hacfed_completions_per_s"] == pytest.approx(64.0)  # median 2.0 s
    assert out["trl_completions_per_s"] == pytest.approx(64.0)
    assert out["ratio"] == pytest.approx(1.0)
    assert out["ratio_per_round"] == pytest.approx([2.0, 1.0, 0.5])
    assert out["ratio_median"] == pytest.approx(1.0)
    text = bench.format_summary({**out, "cpu": bench.summarize([1.0], [1.5], 128)})
    assert "hacfed / TRL = 1.00x" in text and "by process CPU time" in text and "= 1.50x" in text


def test_summarize_refuses_unpaired_rounds(bench):
    with pytest.raises(ValueError, match="same number"):
        bench.summarize([1.0], [1.0, 2.0], 8)
    with pytest.raises(ValueError, match="> 0"):
        bench.summarize([0.0], [1.0], 8)


@pytest.mark.parametrize("task", ["add2", "add2-words", "chain"])
def test_round_problems_are_distinct_and_seeded(bench, task):
    s = bench.BenchSettings(task=task, prompts=4, group_size=2, rounds=3, warmup=1)
    rounds = bench.round_problems(s, bench.make_task(task))
    ids = [p.prompt_id for r in rounds for p in r]
    assert [len(r) for r in rounds] == [4, 4, 4, 4] and len(set(ids)) == 16
    assert ids == [p.prompt_id for r in bench.round_problems(s, bench.make_task(task)) for p in r]
    assert type(bench.make_task(task)).__name__ == {"chain": "ChainTask"}.get(task, "ArithmeticTask")
    assert ("Reply with only the number" in rounds[0][0].messages[-1].content) == (task == "add2-words")


def test_lora_on_both_sides_or_neither(bench):
    s = bench.BenchSettings(finetune="lora")
    hacpo, participant, trl_args, sampling = _sides(bench, s)
    assert participant.finetune == "lora" and bench.mismatches(s, hacpo, participant, trl_args, sampling) == []
    lora = bench.trl_peft_config(s, participant)  # TRL's adapter is hacfed's (`hacfed.clients.training`)
    assert (lora.r, lora.lora_alpha, lora.lora_dropout) == (participant.lora_rank, participant.lora_alpha, 0.0)
    assert bench.trl_peft_config(bench.BenchSettings(), participant) is None
    full = ParticipantConfig(**bench.hacfed_participant_kwargs(bench.BenchSettings()))
    assert bench.mismatches(s, hacpo, full, trl_args, sampling) == ["finetune (hacfed): 'full', want 'lora'"]


def test_missing_trl_is_a_clear_message_and_exit_2(bench, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "trl", None)  # makes `import trl` raise ImportError
    with pytest.raises(SystemExit) as exc:
        bench.main(["--rounds", "1"])
    assert exc.value.code == 2
    assert "pip install -e '.[bench]'" in capsys.readouterr().err


def test_local_step_scores_old_logprobs_ahead_only_for_later_minibatches(monkeypatch):
    """The speed-up the bench measures: minibatch 0 trains on the pre-update policy, so its old
    log-probs come from its own training forward; only minibatches 1.. are scored ahead."""
    import torch

    from hacfed.clients import sequence_ratio, update
    from hacfed.clients.participant import Participant
    from hacfed.hacpo_config import HacpoConfig
    from hacfed.messages import PlannedPrompt, RoundPlan, RoundUpdate, SamplingParams
    from hacfed.models.zoo import build_untrained
    from hacfed.tasks.arithmetic import ArithmeticTask

    task = ArithmeticTask()
    model, tok = build_untrained("tiny-llama", seed=0)
    p = Participant(ParticipantConfig("a", "tiny-llama", minibatch_size=4, learning_rate=1e-3), model, tok, task)
    hacpo = HacpoConfig(mode="gspo", kl_coef=0.0)
    problems = task.train_problems()[:2]
    plan = RoundPlan("run", 0, tuple(PlannedPrompt(q.prompt_id, q.messages) for q in problems), 4,
                     SamplingParams(max_new_tokens=6), hacpo)
    trajectories = p.rollout(plan)
    pool = tuple(
        type(t)(**{**t.without_local_ids().__dict__, "reward": float(i % 2)}) for i, t in enumerate(trajectories)
    )
    calls = []
    real = update.sequence_logprobs

    def counting(model, prompts, responses, pad_id, temperature=1.0):
        calls.append((len(prompts), torch.is_grad_enabled()))
        return real(model, prompts, responses, pad_id, temperature)

    monkeypatch.setattr(update, "sequence_logprobs", counting)  # the training forwards
    monkeypatch.setattr(sequence_ratio, "sequence_logprobs", counting)  # the old log-probs scored ahead
    before = [x.detach().clone() for x in p.model.parameters()]
    metrics = p.train_on_pool(RoundUpdate("run", 0, pool, {}, None, ("a",), hacpo))
    assert calls == [(4, False), (4, True), (4, True)]  # old log-probs of rows 4..7 only, then 2 minibatches
    assert metrics["num_updates"] == 2.0 and all(v == v for v in metrics.values())  # no NaN left behind
    assert any(not torch.equal(a, b) for a, b in zip(before, p.model.parameters()))


def test_per_token_counts_each_sides_sampled_length(bench):
    # hacfed 2 s and 4 s for 10- and 20-token answers, TRL 2 s for 20- then 10-token answers:
    # 8 x (10 + 20) / 6 s = 40 tokens/s against 8 x 30 / 4 s = 60; per round (8x10/2)/(8x20/2) = 0.5
    # and (8x20/4)/(8x10/2) = 1.0. By completions alone the rounds are 1.0 and 0.5.
    out = bench.per_token([2.0, 4.0], [2.0, 2.0], 8, [10.0, 20.0], [20.0, 10.0])
    assert out["hacfed_tokens_per_s"] == pytest.approx(40.0) and out["trl_tokens_per_s"] == pytest.approx(60.0)
    assert out["ratio"] == pytest.approx(2 / 3) and out["ratio_per_round"] == pytest.approx([0.5, 1.0])
    assert out["ratio_median"] == pytest.approx(0.75)
    text = bench.format_summary({**bench.summarize([2.0, 4.0], [2.0, 2.0], 8), "cpu_per_token": out})
    assert "per completion token, by process CPU time: hacfed 40.0, TRL 60.0 tokens/s" in text
    assert "= 0.67x (per round: 0.50 1.00; median 0.75x)" in text and "by wall time" not in text


def test_per_token_refuses_unpaired_or_empty_lengths(bench):
    with pytest.raises(ValueError, match="one mean length per round"):
        bench.per_token([2.0], [2.0], 8, [10.0, 20.0], [20.0])
    with pytest.raises(ValueError, match="same number"):
        bench.per_token([2.0], [2.0, 2.0], 8, [10.0], [20.0, 20.0])
    with pytest.raises(ValueError, match="lengths must be > 0"):
        bench.per_token([2.0], [2.0], 8, [10.0], [0.0])


def test_the_measured_summary_leaves_the_warm_up_out_of_every_figure(bench):
    s = bench.BenchSettings(prompts=4, group_size=2, rounds=2, warmup=1)  # 8 completions a round
    # warm-up round 0 is slow and long on both sides; round 1: hacfed 2 s wall / 1 s CPU, 10 tokens,
    # TRL 4 s / 2 s, 20 tokens
    out = bench.measured_summary(s, [(90.0, 90.0), (2.0, 1.0)], [(99.0, 99.0), (4.0, 2.0)], [48.0, 10.0],
                                 [48.0, 20.0])
    assert out["hacfed_completion_tokens"] == [10.0] and out["trl_completion_tokens"] == [20.0]
    assert out["per_token"]["ratio"] == pytest.approx(1.0)  # (8x10/2) / (8x20/4)
    assert out["cpu_per_token"]["hacfed_tokens_per_s"] == pytest.approx(80.0)
    assert out["cpu"]["ratio"] == pytest.approx(2.0)  # per completion: 8/1 against 8/2
