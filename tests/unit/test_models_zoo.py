"""Zoo presets: sizes, architectures, determinism, no dropout, validation."""

from __future__ import annotations

import pytest
import torch

from hacfed.models.warmup import WarmupConfig
from hacfed.models.zoo import (
    GPT2_DROPOUTS,
    PRESETS,
    Preset,
    build_untrained,
    get_preset,
    parameter_count,
    preset_recipe,
)
from hacfed.trajectory import ChatMessage, render_prompt_ids

ARCH_CLASS = {"llama": "LlamaForCausalLM", "gpt2": "GPT2LMHeadModel", "qwen2": "Qwen2ForCausalLM"}


# Presets with a random initialisation (a preset with a `base` starts from a pretrained model).
ZOO = [name for name, preset in PRESETS.items() if not preset.base]


@pytest.fixture(scope="module")
def built():
    return {name: build_untrained(name, seed=0) for name in ZOO}


def test_required_presets_exist_with_distinct_tokenizers():
    smoke = [PRESETS[name] for name in ("tiny-llama", "tiny-gpt2", "tiny-qwen2")]
    assert len({p.tokenizer for p in smoke}) == len({p.arch for p in smoke}) == 3
    # The testbed has a preset for every architecture and tokenizer of the zoo.
    chain = [p for p in PRESETS.values() if p.task["kind"] == "chain"]
    assert {(p.arch, p.tokenizer) for p in chain} >= {(p.arch, p.tokenizer) for p in smoke}


@pytest.mark.parametrize("name", ZOO)
def test_preset_builds_in_size_range_and_runs(built, name):
    model, tokenizer = built[name]
    preset = get_preset(name)
    assert type(model).__name__ == ARCH_CLASS[preset.arch]
    assert 150_000 <= parameter_count(model) <= 5_000_000
    assert model.config.vocab_size == len(tokenizer)
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    assert model.generation_config.pad_token_id == tokenizer.pad_token_id
    assert model.generation_config.top_k is None  # no hidden top-k truncation
    assert not model.training
    ids = torch.tensor([render_prompt_ids(tokenizer, [ChatMessage("user", "12+34=")])])  # (1, T)
    with torch.no_grad():
        logits = model(input_ids=ids).logits  # (1, T, V)
    assert logits.shape == (1, ids.shape[1], len(tokenizer))


def test_gpt2_has_every_dropout_off(built):
    model, _ = built["tiny-gpt2"]
    for name in GPT2_DROPOUTS:
        assert getattr(model.config, name) == 0.0, name
    dropouts = [m for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    assert dropouts and all(m.p == 0.0 for m in dropouts)


def test_build_is_deterministic_in_seed_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    a, _ = build_untrained("tiny-llama", seed=5)
    assert torch.equal(torch.rand(3), expected_next)
    b, _ = build_untrained("tiny-llama", seed=5)
    c, _ = build_untrained("tiny-llama", seed=6)
    for (key, pa), pb, pc in zip(a.state_dict().items(), b.state_dict().values(), c.state_dict().values()):
        assert torch.equal(pa, pb), key
    assert not all(torch.equal(pa, pc) for pa, pc in zip(a.parameters(), c.parameters()))


def test_unknown_preset_lists_the_presets():
    with pytest.raises(ValueError, match="unknown preset 'tiny-bert'.*tiny-llama, tiny-gpt2, tiny-qwen2"):
        build_untrained("tiny-bert")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(arch="bert"), "arch must be one of"),
        (dict(tokenizer="wordpiece"), "tokenizer must be one of"),
        (dict(name="bad name"), "Preset.name"),
        (dict(config_kwargs={"vocab_size": 10}), "may not set \\['vocab_size'\\]"),
        (dict(warmup={"target_accuracy": 0.4}), "warmup must be a WarmupConfig"),
    ],
)
def test_preset_validation(kwargs, match):
    base = dict(name="x", arch="llama", tokenizer="char", config_kwargs={})
    with pytest.raises(ValueError, match=match):
        Preset(**{**base, **kwargs})


def test_preset_config_is_read_only_and_recipe_tracks_changes():
    preset = get_preset("tiny-qwen2")
    with pytest.raises(TypeError):
        preset.config_kwargs["hidden_size"] = 1  # type: ignore[index]
    recipe = preset_recipe("tiny-qwen2", 0)
    assert recipe["task"]["name"] == "arith-add2"
    assert recipe != preset_recipe("tiny-qwen2", 1)
    changed = Preset(name="tiny-qwen2", arch="qwen2", tokenizer="bpe", config_kwargs=preset.config_kwargs,
                     warmup=WarmupConfig(target_accuracy=0.3))
    assert changed.recipe() != preset.recipe()


@pytest.mark.parametrize("kind, share", [("mostly", 0.10), ("partly", 0.20)])
def test_mostly_and_partly_specialists_see_some_of_the_other_half_and_are_scored_on_their_own(kind, share):
    from hacfed.tasks.chain import operation_of

    for name, own, other in ((f"chain-llama-{kind}-add", "add", "sub"), (f"chain-qwen2-{kind}-sub", "sub", "add")):
        task = get_preset(name).warmup_task()
        train_ops = [operation_of(p) for p in task.train_problems()]
        assert train_ops.count(other) == pytest.approx(share * len(train_ops), rel=0.1), name
        assert {operation_of(p) for p in task.validation_problems()} == {own}, name
        # The pure specialist of the same half is a different build (its recipe has no other_train).
        pure = name.replace(f"{kind}-", "")
        assert preset_recipe(pure, 0)["task"] != preset_recipe(name, 0)["task"]


def test_notation_specialists_read_one_notation_and_see_a_few_prompts_of_the_other():
    from hacfed.tasks.chain import notation_of

    for name, own, other in (("chain-llama-sym", "sym", "word"), ("chain-qwen2-word", "word", "sym")):
        task = get_preset(name).warmup_task()
        train = [notation_of(p) for p in task.train_problems()]
        assert train.count(other) == 200 and train.count(own) == 8000, name
        assert {notation_of(p) for p in task.validation_problems()} == {own}, name
    assert preset_recipe("chain-llama-sym", 0)["task"] != preset_recipe("chain-llama", 0)["task"]


def test_words_partner_warms_up_on_the_sim_words_task_and_reads_its_prompts():
    """tiny-llama-words learns `hacfed sim --task add2-words`'s own train split (so its warm-up stops on
    that task's validation split and never sees its 500 test problems), through a tokenizer that has
    every character of the sentence prompts."""
    from hacfed.tasks.registry import load_task
    from hacfed.tools.sim import TASKS

    preset = get_preset("tiny-llama-words")
    assert dict(preset.task) == TASKS["add2-words"][0]
    task, sim_task = preset.warmup_task(), load_task(TASKS["add2-words"][0])
    assert task.train_problems() == sim_task.train_problems()
    assert task.validation_problems() == sim_task.validation_problems() and len(task.eval_problems()) == 500
    assert task.train_problems()[0].messages[0].content.startswith("What is ")
    _, tokenizer = build_untrained("tiny-llama-words")
    ids = render_prompt_ids(tokenizer, task.train_problems()[0].messages)
    assert tokenizer.unk_token_id not in ids
    assert preset_recipe("tiny-llama-words", 0)["task"]["name"] == "arith-add2-words"
    assert preset_recipe("tiny-llama-words", 0)["preset"] != preset_recipe("tiny-llama", 0)["preset"]


def test_worked_partner_is_another_architecture_and_tokenizer_on_the_sim_words_task():
    """tiny-qwen2-worked (Qwen2, byte-level BPE, ChatML) learns add2-words' own train split with worked
    answers; its prompts are the sim task's, byte for byte."""
    from hacfed.tasks.registry import load_task
    from hacfed.tools.sim import TASKS

    preset = get_preset("tiny-qwen2-worked")
    assert (preset.arch, preset.tokenizer) == ("qwen2", "bpe") and not preset.base
    task, sim_task = preset.warmup_task(), load_task(TASKS["add2-words"][0])
    assert dict(preset.task) == {**TASKS["add2-words"][0], "solution_form": "worked"}
    assert [p.messages for p in task.train_problems()] == [p.messages for p in sim_task.train_problems()]
    assert task.validation_problems()[0].solution.count(" = ") == 1
    assert preset.warmup.eval_max_new_tokens >= 20  # `37 + 58 = 95` and EOS take ~12 BPE tokens
    assert parameter_count(build_untrained("tiny-qwen2-worked")[0]) > parameter_count(build_untrained("tiny-qwen2")[0])


def test_a_preset_with_a_base_starts_from_it_and_records_its_version():
    from hacfed.model_spec import smollm2_version

    preset = get_preset("smollm2-drilled")
    assert preset.base == "smollm2" and preset.tokenizer == "base"
    recipe = preset_recipe("smollm2-drilled", 0)
    assert recipe["preset"]["base"] == "smollm2" and recipe["base_version"] == smollm2_version()
    assert "base" not in preset_recipe("tiny-qwen2", 0)["preset"]  # the zoo's recipes (and hashes) are unchanged
    with pytest.raises(ValueError, match="starts from the pretrained 'smollm2'"):
        build_untrained("smollm2-drilled")
    for bad in (dict(base="gpt4"), dict(base="smollm2", tokenizer="bpe"),
                dict(base="smollm2", tokenizer="base", config_kwargs={"hidden_size": 8})):
        with pytest.raises(ValueError, match="base must be one of"):
            Preset(**{"name": "x", "arch": "llama", "tokenizer": "base", "config_kwargs": {}, **bad})


def test_the_drilled_warm_up_never_sees_a_validation_or_test_problem():
    """smollm2-drilled trains on add2-words' train split and stops on the first 64 validation problems."""
    from hacfed.tasks.registry import load_task
    from hacfed.tools.sim import TASKS

    task, sim_task = get_preset("smollm2-drilled").warmup_task(), load_task(TASKS["add2-words"][0])
    assert task.validation_problems() == tuple(
        p.__class__(p.prompt_id, p.messages, p.answer, f"{p.prompt_id.split(':')[1].replace('+', ' + ')} = {p.answer}")
        for p in sim_task.validation_problems()[:64])
    held_out = {p.prompt_id for p in (*sim_task.validation_problems(), *sim_task.eval_problems())}
    assert held_out.isdisjoint(p.prompt_id for p in task.train_problems())
