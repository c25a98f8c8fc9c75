"""The built-in zoo: tiny Llama-, GPT-2- and Qwen2-style agents with different tokenizers.

Each preset is a heterogeneous "lab model" small enough (~1M parameters) to roll out and train on
two CPU cores, yet a real transformers architecture, so the same code path serves real checkpoints.

    model, tokenizer = build_untrained("tiny-gpt2", seed=0)   # random init, no network

A preset with a `base` starts from a pretrained model instead (`smollm2-drilled`: SmolLM2-135M-Instruct
after a short supervised fine-tune), so one model at two training states is a pair of agents.
`hacfed.models.store.ensure_built` adds the supervised warm-up and the on-disk cache on top.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, Mapping, get_args

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from hacfed.models import gguf
from hacfed.models.prepare import configure_generation, prepare_for_rl
from hacfed.models.tokenizers import TOKENIZER_KINDS, build_tokenizer
from hacfed.models.warmup import WarmupConfig, WarmupResult, warm_up
from hacfed.tasks.base import Task
from hacfed.tasks.registry import load_task

# The quick smoke task every original preset warms up on: 2-digit addition.
# Its warm-up stops on the 200-problem validation split (never on the test split reports use).
ADD2_TASK: Mapping[str, Any] = MappingProxyType(
    {"kind": "arithmetic", "digits": 2, "operators": "+", "num_validation": 200}
)

Arch = Literal["llama", "gpt2", "qwen2"]
ARCHS: tuple[str, ...] = get_args(Arch)
# Pretrained models a preset may start from (hacfed.models.loading), and the tokenizer such a preset
# names: the base model's own.
BASES = ("smollm2",)
BASE_TOKENIZER = "base"

_CONFIG_CLASSES = {"llama": LlamaConfig, "gpt2": GPT2Config, "qwen2": Qwen2Config}
_MODEL_CLASSES = {"llama": LlamaForCausalLM, "gpt2": GPT2LMHeadModel, "qwen2": Qwen2ForCausalLM}

# RL needs the rollout policy and the trained policy to be the same function: any dropout makes the
# importance ratio noisy even on-policy. GPT-2's config enables four dropouts by default.
GPT2_DROPOUTS = ("resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_first_dropout")


@dataclass(frozen=True)
class Preset:
    """A zoo entry: architecture, tokenizer and the warm-up recipe that makes it a useful RL start.

    warmup.target_accuracy is deliberately modest (~0.4 held-out greedy accuracy on 2-digit
    addition) so RL has headroom to show gains. base: "" (a random initialisation of `arch` with the
    zoo tokenizer `tokenizer`), or a pretrained model of BASES that the warm-up fine-tunes, whole; its
    tokenizer is then the base's own (BASE_TOKENIZER) and config_kwargs is empty.
    """

    name: str
    arch: Arch
    tokenizer: str
    config_kwargs: Mapping[str, Any] = field(hash=False)
    warmup: WarmupConfig = WarmupConfig()
    description: str = ""
    task: Mapping[str, Any] = field(default_factory=lambda: dict(ADD2_TASK), hash=False)  # load_task spec
    base: str = ""

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("-", "").isalnum():
            raise ValueError(f"Preset.name must be non-empty, letters/digits/dashes, got {self.name!r}")
        if self.arch not in ARCHS:
            raise ValueError(f"Preset {self.name}: arch must be one of {ARCHS}, got {self.arch!r}")
        if self.base:
            if self.base not in BASES or self.tokenizer != BASE_TOKENIZER or self.config_kwargs:
                raise ValueError(f"Preset {self.name}: base must be one of {BASES}, with tokenizer "
                                 f"{BASE_TOKENIZER!r} and no config_kwargs, got {self.base!r}/{self.tokenizer!r}")
        elif self.tokenizer not in TOKENIZER_KINDS:
            raise ValueError(f"Preset {self.name}: tokenizer must be one of {TOKENIZER_KINDS}, got {self.tokenizer!r}")
        if not isinstance(self.warmup, WarmupConfig):
            raise ValueError(f"Preset {self.name}: warmup must be a WarmupConfig, got {self.warmup!r}")
        taken = {"vocab_size", "pad_token_id", "bos_token_id", "eos_token_id"} & set(self.config_kwargs)
        if taken:
            raise ValueError(f"Preset {self.name}: config_kwargs may not set {sorted(taken)} "
                             "(taken from the tokenizer)")
        object.__setattr__(self, "config_kwargs", MappingProxyType(dict(self.config_kwargs)))
        object.__setattr__(self, "task", MappingProxyType(dict(self.task)))

    def warmup_task(self) -> Task:
        return load_task(dict(self.task))

    def recipe(self) -> dict[str, Any]:
        """Everything that determines the built model (cache metadata and staleness checks)."""
        recipe = {
            "name": self.name, "arch": self.arch, "tokenizer": self.tokenizer,
            "config_kwargs": dict(self.config_kwargs), "warmup": asdict(self.warmup), "task": dict(self.task),
        }
        return {**recipe, "base": self.base} if self.base else recipe  # the zoo's recipes (hashes) unchanged


LLAMA_CONFIG: Mapping[str, Any] = MappingProxyType(dict(
    hidden_size=128, intermediate_size=352, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=4, max_position_embeddings=512, tie_word_embeddings=True,
))
GPT2_CONFIG: Mapping[str, Any] = MappingProxyType(dict(
    n_embd=128, n_layer=4, n_head=4, n_positions=512, tie_word_embeddings=True,
    activation_function="gelu_pytorch_tanh",  # fused kernel; same function as "gelu_new"
    **{name: 0.0 for name in GPT2_DROPOUTS},
))
QWEN2_CONFIG: Mapping[str, Any] = MappingProxyType(dict(
    hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True,
))


def _chain(operations: tuple[str, ...] = ("add", "sub"), other_train: int = 0,
           notations: tuple[str, ...] = ("sym",)) -> dict[str, Any]:
    spec: dict[str, Any] = {"kind": "chain", "terms": 3, "operations": list(operations)}
    if notations != ("sym",):
        spec["notations"] = list(notations)
    return {**spec, "other_train": other_train} if other_train else spec


# The words-style sums of `hacfed sim --task add2-words` (the same spec, so the same train,
# validation and 500-problem test splits): a partner for pretrained chat models, which the
# `37+58=` presets cannot be (they score 0 on a sentence prompt).
ADD2_WORDS_TASK: Mapping[str, Any] = MappingProxyType(
    {"kind": "arithmetic", "digits": 2, "operators": "+", "num_eval": 500, "num_validation": 200, "style": "words"}
)
WORDS_WARMUP = WarmupConfig(target_accuracy=0.35, max_accuracy=0.60)
# The same sums with worked answers (`37 + 58 = 95`, SmolLM2's own form), for a cross-architecture
# partner whose successes SmolLM2 finds likely. Its greedy answers take ~12 BPE tokens (24 budget);
# the band is above SmolLM2's ~0.22, so the partner rescues prompts SmolLM2 fails.
ADD2_WORDS_WORKED_TASK: Mapping[str, Any] = MappingProxyType({**ADD2_WORDS_TASK, "solution_form": "worked"})
WORKED_WARMUP = WarmupConfig(target_accuracy=0.40, max_accuracy=0.60, max_steps=3000, check_every=5,
                             coarse_check_every=25, eval_max_new_tokens=24)
# "state" for a pretrained model: SmolLM2 fine-tuned (every weight) on the same worked sums of the train
# split, stopped in a band above its own ~0.22. Batches of 8 (a step of the 135M model takes seconds on one
# core); greedy screens on the first 64 problems of add2-words' validation split (the teacher-forced
# screen reads the worked form only, which SmolLM2 writes in its own words at first).
DRILL_TASK: Mapping[str, Any] = MappingProxyType({**ADD2_WORDS_TASK, "solution_form": "worked", "num_validation": 64})
# The drill lifts accuracy fast (0.22 -> 0.58 within 10 steps at lr 2e-5), so it steps gently and
# screens every other step.
DRILL_WARMUP = WarmupConfig(target_accuracy=0.40, max_accuracy=0.60, max_steps=60, check_every=2,
                            coarse_check_every=2, batch_size=8, learning_rate=1e-5, lr_warmup_steps=5,
                            weight_decay=0.0, eval_max_new_tokens=32, greedy_screens=True)
QWEN2_WIDE_CONFIG: Mapping[str, Any] = MappingProxyType({
    **QWEN2_CONFIG, "hidden_size": 192, "intermediate_size": 576, "num_attention_heads": 6, "num_key_value_heads": 3,
})


# "Mostly" specialists see this many of the other half's train problems in their warm-up (~10 % of
# their ~4,000 own): bench/skill_transfer.py measured that a pure specialist cannot learn the other
# half within an RL run's budget even from gold solutions, so sharing has nothing to amplify.
MOSTLY_OTHER_TRAIN = 400
# "Partly" specialists: 1,000 of the other half (~20 % of their warm-up's train problems).
# The mostly specialists solve the other half 1 % of the time, and a 20-round run does not turn that
# into a skill in any mode; these start with a partial skill for rollouts, own or a peer's, to grow.
PARTLY_OTHER_TRAIN = 1000
# Notation specialists: both operations, prompts written one way (`47+28+15=` or `What is
# 47 plus 28 plus 15?`), plus this many train problems written the other way (~2.5 % of 8,000).
# bench/skill_transfer.py: reading the other notation is learnt from gold solutions within 160 steps
# at lr 2e-4, where a new operation is not learnt in 320 steps at 1e-3.
NOTATION_OTHER_TRAIN = 200


# The testbed presets warm up on worked multi-step arithmetic (hacfed.tasks.chain): responses of
# 23-33 tokens. Band checks use the validation split; the greedy check needs ~35 new tokens.
CHAIN_WARMUP = WarmupConfig(
    target_accuracy=0.30, max_accuracy=0.45, max_steps=4000, check_every=10, coarse_check_every=50,
    eval_max_new_tokens=48,
)
# "state" heterogeneity: the same model and seed stopped at an earlier point of the same warm-up.
CHAIN_WARMUP_EARLY = replace(CHAIN_WARMUP, target_accuracy=0.10, max_accuracy=0.20)
# A specialist's accuracy can jump from 0.1 to 0.6 within 50 steps (subtraction chains do): screen
# every few steps so the warm-up stops inside the band.
CHAIN_WARMUP_SPECIALIST = replace(CHAIN_WARMUP, check_every=5, coarse_check_every=5)
# Subtraction chains: greedy accuracy jumps 0.15 -> 0.50 in 15 steps and runs far ahead of the
# teacher-forced screen, so screen with greedy accuracy itself (every 50 steps, then every 5).
CHAIN_WARMUP_SUB = replace(CHAIN_WARMUP, target_accuracy=0.25, check_every=5, greedy_screens=True)
# "size" heterogeneity: the same data and number of steps, different capacity (no band).
CHAIN_WARMUP_FIXED = replace(CHAIN_WARMUP, fixed_steps=True, max_steps=900)

PRESETS: Mapping[str, Preset] = MappingProxyType({p.name: p for p in (
    # The quick smoke agents (2-digit addition, 2-4 token answers): the default demo.
    Preset("tiny-llama", "llama", "char", LLAMA_CONFIG,
           description="Llama-style, character-level tokenizer, Zephyr-like chat template"),
    Preset("tiny-gpt2", "gpt2", "byte", GPT2_CONFIG,
           description="GPT-2-style, byte-level tokenizer, 'User:/Assistant:' chat template, dropout 0"),
    Preset("tiny-qwen2", "qwen2", "bpe", QWEN2_CONFIG,
           description="Qwen2-style (GQA), small byte-level BPE trained on task text, ChatML template"),
    # A partner for SmolLM2 & co. on `--task add2-words`: reads the whole sentence, answers the number.
    Preset("tiny-llama-words", "llama", "char", LLAMA_CONFIG, WORDS_WARMUP, task=dict(ADD2_WORDS_TASK),
           description="tiny-llama warmed up on 'What is 37 + 58? Reply with only the number.'"),
    # A cross-architecture partner for SmolLM2 on `--task add2-words` that answers in SmolLM2's form.
    Preset("tiny-qwen2-worked", "qwen2", "bpe", QWEN2_WIDE_CONFIG, WORKED_WARMUP, task=dict(ADD2_WORDS_WORKED_TASK),
           description="tiny-qwen2 at 1.5x width warmed up on add2-words with worked answers ('37 + 58 = 95')"),
    # "state" for SmolLM2: the same model after a short supervised fine-tune on worked sums.
    Preset("smollm2-drilled", "llama", BASE_TOKENIZER, {}, DRILL_WARMUP, task=dict(DRILL_TASK), base="smollm2",
           description="SmolLM2-135M-Instruct fine-tuned on add2-words' train split with worked answers "
                       "('37 + 58 = 95'), stopped at greedy accuracy 0.40-0.60"),
    # The testbed (chain task): "model" heterogeneity is any two of these three.
    Preset("chain-llama", "llama", "char", LLAMA_CONFIG, CHAIN_WARMUP, task=_chain(),
           description="tiny-llama warmed up on worked 3-term add/sub chains"),
    Preset("chain-gpt2", "gpt2", "byte", GPT2_CONFIG, CHAIN_WARMUP, task=_chain(),
           description="tiny-gpt2 warmed up on worked 3-term add/sub chains"),
    Preset("chain-qwen2", "qwen2", "bpe", QWEN2_CONFIG, CHAIN_WARMUP, task=_chain(),
           description="tiny-qwen2 warmed up on worked 3-term add/sub chains"),
    # "state": chain-llama at an earlier stage of the same warm-up.
    Preset("chain-llama-early", "llama", "char", LLAMA_CONFIG, CHAIN_WARMUP_EARLY, task=_chain(),
           description="chain-llama stopped early (greedy accuracy 0.10-0.20)"),
    # "size": one tokenizer (BPE), two widths, the same warm-up steps.
    Preset("chain-qwen2-small", "qwen2", "bpe",
           {**QWEN2_CONFIG, "hidden_size": 64, "intermediate_size": 192, "num_attention_heads": 2,
            "num_key_value_heads": 1},
           CHAIN_WARMUP_FIXED, task=_chain(), description="tiny-qwen2 at half width, fixed warm-up steps"),
    Preset("chain-qwen2-large", "qwen2", "bpe",
           {**QWEN2_CONFIG, "hidden_size": 192, "intermediate_size": 576, "num_attention_heads": 6,
            "num_key_value_heads": 3},
           CHAIN_WARMUP_FIXED, task=_chain(), description="tiny-qwen2 at 1.5x width, fixed warm-up steps"),
    # "size", second design: one tokenizer, two widths, both warmed up into the same band as
    # chain-qwen2, so the narrower model starts inside the task's reach (with the fixed 900 steps
    # above, chain-qwen2-small starts at ~0.05 and barely learns in any mode).
    Preset("chain-qwen2-wide", "qwen2", "bpe",
           {**QWEN2_CONFIG, "hidden_size": 192, "intermediate_size": 576, "num_attention_heads": 6,
            "num_key_value_heads": 3},
           CHAIN_WARMUP, task=_chain(), description="tiny-qwen2 at 1.5x width, warmed up into chain-qwen2's band"),
    # "skills": agents warmed up on different halves of the mix; each rarely solves the other half.
    Preset("chain-llama-add", "llama", "char", LLAMA_CONFIG, CHAIN_WARMUP_SPECIALIST, task=_chain(("add",)),
           description="tiny-llama warmed up on addition chains only"),
    Preset("chain-qwen2-sub", "qwen2", "bpe", QWEN2_CONFIG, CHAIN_WARMUP_SUB, task=_chain(("sub",)),
           description="tiny-qwen2 warmed up on subtraction chains only"),
    # "skills", second design: each specialist's warm-up also holds a few of the other half.
    Preset("chain-llama-mostly-add", "llama", "char", LLAMA_CONFIG, CHAIN_WARMUP_SPECIALIST,
           task=_chain(("add",), MOSTLY_OTHER_TRAIN),
           description="tiny-llama warmed up on addition chains plus a few subtraction chains (~10 %)"),
    Preset("chain-qwen2-mostly-sub", "qwen2", "bpe", QWEN2_CONFIG, CHAIN_WARMUP_SUB,
           task=_chain(("sub",), MOSTLY_OTHER_TRAIN),
           description="tiny-qwen2 warmed up on subtraction chains plus a few addition chains (~10 %)"),
    # "skills", third design: each specialist's warm-up holds a fifth of the other half's examples.
    Preset("chain-llama-partly-add", "llama", "char", LLAMA_CONFIG, CHAIN_WARMUP_SPECIALIST,
           task=_chain(("add",), PARTLY_OTHER_TRAIN),
           description="tiny-llama warmed up on addition chains plus some subtraction chains (~20 %)"),
    Preset("chain-qwen2-partly-sub", "qwen2", "bpe", QWEN2_CONFIG, CHAIN_WARMUP_SUB,
           task=_chain(("sub",), PARTLY_OTHER_TRAIN),
           description="tiny-qwen2 warmed up on subtraction chains plus some addition chains (~20 %)"),
    # Complementary skills, notations: one reads symbols, the other words (a little of the other each).
    Preset("chain-llama-sym", "llama", "char", LLAMA_CONFIG, CHAIN_WARMUP,
           task=_chain(other_train=NOTATION_OTHER_TRAIN),
           description="tiny-llama warmed up on chains written '47+28+15=', plus a few in words (~2.5 %)"),
    Preset("chain-qwen2-word", "qwen2", "bpe", QWEN2_CONFIG, CHAIN_WARMUP,
           task=_chain(other_train=NOTATION_OTHER_TRAIN, notations=("word",)),
           description="tiny-qwen2 warmed up on chains written 'What is 47 plus 28 plus 15?', plus a few with "
                       "symbols (~2.5 %)"),
)})


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; available presets: {', '.join(PRESETS)}") from None


def build_untrained(name: str, seed: int = 0) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """A randomly initialised preset model (float32, eval mode) and its tokenizer.

    Deterministic in `seed`; the caller's global torch RNG state is left untouched.
    """
    preset = get_preset(name)
    if preset.base:
        raise ValueError(f"preset {name!r} starts from the pretrained {preset.base!r}; it has no untrained form")
    tokenizer = build_tokenizer(preset.tokenizer)
    config = _CONFIG_CLASSES[preset.arch](
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **preset.config_kwargs,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = _MODEL_CLASSES[preset.arch](config)
    model.eval()
    configure_generation(model, tokenizer)
    return model, tokenizer


def parameter_count(model: torch.nn.Module) -> int:
    """Unique parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def preset_recipe(name: str, seed: int) -> dict[str, Any]:
    """Everything that determines a warmed-up build; its hash keys the on-disk cache."""
    preset = get_preset(name)
    recipe = {"preset": preset.recipe(), "seed": seed, "task": {"name": preset.warmup_task().name, **preset.task}}
    if preset.base:  # another release of the base model is another build
        recipe["base_version"] = gguf.smollm2_version()
    return recipe


def start_model(name: str, seed: int) -> tuple[PreTrainedModel, Any]:
    """What a preset's warm-up starts from: `build_untrained`, or its pretrained base as hacfed loads it
    (float32, no dropout, eval mode), ready to be saved as an ordinary model."""
    preset = get_preset(name)
    if not preset.base:
        return build_untrained(name, seed)
    model, tokenizer = gguf.load_smollm2(torch.float32)  # BASES: SmolLM2 is the one base there is
    prepare_for_rl(model, tokenizer, preset.base)
    gguf.forget_quantization(model)
    return model, tokenizer


def warm_up_preset(
    name: str, seed: int, *, progress: bool = True
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast, WarmupResult]:
    """`start_model` + supervised warm-up on the preset's task, in memory (deterministic in `seed`).

    Raises if warm-up misses its accuracy band: a cached model outside the band would silently
    change every experiment built on it.
    """
    preset = get_preset(name)
    model, tokenizer = start_model(name, seed)
    task = preset.warmup_task()
    result = warm_up(model, tokenizer, task, preset.warmup, seed, progress=progress, desc=f"warm-up {name}")
    if not result.reached_target:
        raise RuntimeError(
            f"warm-up of {name} (seed {seed}) ended at held-out accuracy {result.accuracy:.3f} after "
            f"{result.steps} steps, outside [{preset.warmup.target_accuracy}, {preset.warmup.max_accuracy}]"
        )
    return model, tokenizer, result


def build_warmed_up(name: str, seed: int, out_dir: Path, *, progress: bool = True) -> dict[str, Any]:
    """The store's builder: `warm_up_preset`, then `save_pretrained` into `out_dir`; returns metadata."""
    model, tokenizer, result = warm_up_preset(name, seed, progress=progress)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    preset = get_preset(name)
    return {
        "arch": preset.arch, "tokenizer": preset.tokenizer, "parameters": parameter_count(model),
        "task": preset.warmup_task().name, "warmup_steps": result.steps, "heldout_accuracy": result.accuracy,
        "warmup_seconds": round(result.seconds, 3), "recipe": preset_recipe(name, seed),
    }
