"""Named training modes: what `--mode` means in `hacfed sim`, `hacfed demo` and the coordinator's config.

    hacfed sim --mode xhacpo          # hacfed's recommended mode (docs/xhacpo.md)
    hacfed sim --mode gspo2           # the paper's strongest baseline: each lab alone, 2G rollouts

A mode is a `HacpoConfig` (the loss every lab applies, sent in each round's plan) plus how many
responses per prompt each lab samples. Torch-free: the coordinator builds its config from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping

from hacfed.hacpo_config import HacpoConfig


@dataclass(frozen=True)
class NamedMode:
    name: str
    settings: Mapping[str, Any]  # HacpoConfig fields that differ from the paper's defaults
    summary: str  # one line for --help
    rollout_multiplier: int = 1  # responses per prompt = G × this
    shares: bool = True  # whether labs learn from each other's rollouts


# xhacpo = HACPO's four mechanisms + three changes to how a peer's sample is used (docs/xhacpo.md).
XHACPO = {"mode": "xhacpo", "cross_ratio_unit": "byte", "cross_clip_style": "pessimistic", "cross_negatives": "skip"}
# The learner-side rules' study settings (docs/partner_rules.md): rescue, likelihood floor, trust.
PARTNER_RULES = {"rescue_max_own_reward": 0.0, "partner_min_byte_prob": 0.5, "trust_rate": 0.5}
# Guided rollouts (docs/partner_rules.md): on a prompt all of the learner's own samples failed, 4 own
# continuations with a partner's verified success as a hint; partners' samples serve only as hints.
GUIDED = {"guide_samples": 4, "partner_use": "context"}

_MODES = (
    NamedMode("xhacpo", XHACPO, "recommended: HACPO that learns from peers' successes only, with a "
              "tokenizer-invariant ratio and a one-sided clip (docs/xhacpo.md)"),
    NamedMode("hacpo", {"mode": "hacpo"}, "paper-exact HACPO (Zhang et al. 2026): the four mechanisms, docs/hacpo.md"),
    NamedMode("naive", {"mode": "naive"}, "share rollouts with none of HACPO's mechanisms (the paper's Naive)"),
    NamedMode("sapo", {"mode": "sapo"}, "RL Swarm's SAPO: peers' text scored by the learner as its own "
              "on-policy samples, no source log-probs"),
    NamedMode("gspo", {"mode": "gspo"}, "each lab alone with G responses per prompt (no sharing)", shares=False),
    NamedMode("gspo2", {"mode": "gspo"}, "each lab alone with 2G responses per prompt: the paper's GSPO×2",
              rollout_multiplier=2, shares=False),
    NamedMode("grpo", {"mode": "grpo"}, "each lab alone, GRPO with token-level ratios and DAPO's clip-higher "
              "0.2/0.28", shares=False),
    # The paper's ablations of HACPO (its Table 3 and §5).
    NamedMode("hacpo-noadv", {"mode": "hacpo", "capability_baseline": False},
              "ablation -Adv: HACPO with the plain group-mean baseline"),
    NamedMode("hacpo-noomega", {"mode": "hacpo", "capability_coefficient": False},
              "ablation -ω: HACPO without the capability coefficient"),
    NamedMode("hacpo-alpha0", {"mode": "hacpo", "alpha": 0.0}, "ablation: HACPO with α = 0"),
    NamedMode("hacpo-alpha2", {"mode": "hacpo", "alpha": 2.0}, "ablation: HACPO with α = 2"),
    NamedMode("hacpo-nostep", {"mode": "hacpo", "stepwise_clip": False},
              "ablation: HACPO with a static cross-clip bound 1 - δ"),
    NamedMode("hacpo-noclip", {"mode": "hacpo", "cross_clip": False}, "ablation: HACPO without the cross clip"),
    # Ablations of xhacpo: each undoes one of its three changes.
    NamedMode("xhacpo-negatives", {**XHACPO, "cross_negatives": "learn"},
              "xhacpo ablation: also push down peers' failures (as HACPO does)"),
    NamedMode("xhacpo-hardclip", {**XHACPO, "cross_clip_style": "hard"},
              "xhacpo ablation: HACPO's two-sided cross clip"),
    NamedMode("xhacpo-token", {**XHACPO, "cross_ratio_unit": "token"},
              "xhacpo ablation: HACPO's per-token ratio"),
    # xhacpo with the learner-side rules for a partner's sample (docs/partner_rules.md), one at a time
    # and together; candidates for a pretrained learner, each to be chosen on the validation split.
    NamedMode("xhacpo-rescue", {**XHACPO, "rescue_max_own_reward": 0.0},
              "xhacpo, a partner's samples counting only where all of the learner's own failed"),
    NamedMode("xhacpo-likely", {**XHACPO, "partner_min_byte_prob": 0.5},
              "xhacpo, leaving out partner text the learner finds improbable (< .5 per byte)"),
    NamedMode("xhacpo-trust", {**XHACPO, "trust_rate": 0.5},
              "xhacpo, each partner's ω scaled by the trust the lab learns in it"),
    NamedMode("xhacpo-rules", {**XHACPO, **PARTNER_RULES},
              "xhacpo with rescue, the likelihood floor and learned trust together"),
    NamedMode("xhacpo-guided", {**XHACPO, **GUIDED},
              "a partner's verified success only as a hint where the learner failed: its own hinted "
              "continuations, trained as samples of the plain prompt"),
    NamedMode("xhacpo-guided-hinted", {**XHACPO, **GUIDED, "guide_context": "hinted"},
              "xhacpo-guided, the continuations trained with the hint in context (strictly on-policy)"),
)
MODES: Mapping[str, NamedMode] = MappingProxyType({m.name: m for m in _MODES})
MODE_NAMES: tuple[str, ...] = tuple(MODES)
RECOMMENDED = "xhacpo"


def get_mode(name: str) -> NamedMode:
    try:
        return MODES[name]
    except KeyError:
        raise ValueError(f"unknown mode {name!r}; choose one of {', '.join(MODE_NAMES)}") from None


def hacpo_config_for(name: str, overrides: Mapping[str, Any] | None = None) -> HacpoConfig:
    """The HacpoConfig of mode `name`, with paper defaults for every setting it does not name."""
    mode = get_mode(name)
    return HacpoConfig.from_dict({**HacpoConfig().to_dict(), **mode.settings, **(overrides or {})})


def modes_help() -> str:
    """One line per mode, for --help epilogs."""
    width = max(len(n) for n in MODE_NAMES)
    return "modes:\n" + "\n".join(f"  {m.name:<{width}}  {m.summary}" for m in _MODES)
