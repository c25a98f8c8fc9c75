"""HACPO hyper-parameters (docs/hacpo.md §5-§6). Torch-free so the coordinator can carry them."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Literal

Mode = Literal["hacpo", "xhacpo", "naive", "sapo", "gspo", "grpo"]
MODES: tuple[str, ...] = ("hacpo", "xhacpo", "naive", "sapo", "gspo", "grpo")
HACPO_FAMILY = ("hacpo", "xhacpo")  # the modes with the four mechanisms
ABLATION_FLAGS = ("capability_baseline", "capability_coefficient", "stepwise_clip", "cross_clip")
RatioUnit = Literal["token", "byte"]
ClipStyle = Literal["hard", "pessimistic"]
# Learner-side rules for a partner's sample (docs/partner_rules.md), xhacpo only. Each default leaves
# the rule off, so every mode's update is unchanged unless one is set.
PARTNER_RULE_DEFAULTS = {
    "rescue_max_own_reward": 1.0,
    "partner_min_byte_prob": 0.0,
    "trust_rate": 0.0,
    "trust_target": 0.25,
    "trust_floor": 0.01,
}
# Guided rollouts (docs/partner_rules.md), xhacpo only: off while guide_samples is 0.
GUIDE_DEFAULTS = {
    "guide_samples": 0,
    "guide_max_own_reward": 0.0,
}
GUIDE_MAX_SAMPLES = 64
EXTENSION_CHOICES = {
    "cross_ratio_unit": ("token", "byte"),
    "cross_clip_style": ("hard", "pessimistic"),
    "cross_negatives": ("learn", "skip"),
    "guide_hint": ("response", "answer"),
    "guide_context": ("plain", "hinted"),
    "partner_use": ("gradient", "context"),
}
GUIDE_CHOICES = ("guide_hint", "guide_context", "partner_use")


@dataclass(frozen=True)
class HacpoConfig:
    """Every setting of the HACPO objective. Defaults reproduce the paper (App. A, authors' code).

    mode:
      - "hacpo": the four mechanisms (capability-aware baseline, coefficient ω, exponential IS
        with α, stepwise clipping of cross-agent ratios).
      - "naive": pooled group baseline (plain mean/std over all agents' samples), no ω, no α,
        every sample clipped like an own sample against its source log-prob.
      - "gspo": own samples only; other agents' samples are ignored.
    Ablation flags (only meaningful in "hacpo" mode):
      capability_baseline: off -> plain group mean as baseline (paper's "-Adv").
      capability_coefficient: off -> ω = 1 (paper's "-ω").
      stepwise_clip: off -> static lower bound 1 - δ for cross samples.
      cross_clip: off -> cross-agent ratios are not clipped at all.
    xhacpo's extensions (docs/xhacpo.md): cross_ratio_unit, cross_clip_style, cross_negatives.
    Learner-side rules for a partner's sample, xhacpo only, each off by default (docs/partner_rules.md):
      rescue_max_own_reward: a partner's samples of a prompt count only where the learner's own
        group's mean reward is <= this (0.0: only where all own samples failed; 1.0: always).
      partner_min_byte_prob: a partner's sample whose per-byte probability under the learner,
        exp(Σ log π_k / bytes), is below this is left out (0.0: none is).
      trust_rate, trust_target, trust_floor: per-partner trust each lab learns from its own pool
        (hacfed.clients.trust); trust_rate 0 keeps every weight at 1.
    Guided rollouts, xhacpo only, off while guide_samples is 0 (docs/partner_rules.md, hacfed.clients.guided):
      guide_samples: on a prompt where the learner's own group mean reward is <= guide_max_own_reward
        and a partner has a verified success, the learner samples this many extra continuations of
        its own policy with that success in its prompt as a hint, scored by agreement with it.
      guide_hint: "response" (the partner's whole response in the hint) or "answer" (only its answer).
      guide_context: "plain" (train them as samples of the original prompt, the hint dropped) or
        "hinted" (train them with the hint in context).
      partner_use: "gradient" (partners' samples train as the mode says) or "context" (they only
        serve as hints and carry no gradient).
    """

    mode: Mode = "hacpo"
    self_clip_low: float = 3e-4
    self_clip_high: float = 4e-4
    cross_clip_delta: float = 0.2
    cross_clip_step: float = 0.025
    alpha: float = 1.0
    capability_window: int = 5
    ratio_min: float = 0.1
    ratio_max: float = 10.0
    max_abs_log_ratio: float = 10.0
    adv_eps: float = 1e-6
    reward_max: float = 1.0
    kl_coef: float = 0.001
    capability_baseline: bool = True
    capability_coefficient: bool = True
    stepwise_clip: bool = True
    cross_clip: bool = True
    grpo_clip_low: float = 0.2
    grpo_clip_high: float = 0.28
    cross_ratio_unit: RatioUnit = "token"
    cross_clip_style: ClipStyle = "hard"
    cross_negatives: Literal["learn", "skip"] = "learn"
    rescue_max_own_reward: float = 1.0
    partner_min_byte_prob: float = 0.0
    trust_rate: float = 0.0
    trust_target: float = 0.25
    trust_floor: float = 0.01
    guide_samples: int = 0
    guide_max_own_reward: float = 0.0
    guide_hint: Literal["response", "answer"] = "response"
    guide_context: Literal["plain", "hinted"] = "plain"
    partner_use: Literal["gradient", "context"] = "gradient"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"HacpoConfig.mode must be one of {MODES}, got {self.mode!r}")
        for name, choices in EXTENSION_CHOICES.items():
            if getattr(self, name) not in choices:
                raise ValueError(f"HacpoConfig.{name} must be one of {choices}, got {getattr(self, name)!r}")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "mode" or f.name in EXTENSION_CHOICES:
                continue
            if f.name in ABLATION_FLAGS:
                if not isinstance(value, bool):
                    raise ValueError(f"HacpoConfig.{f.name} must be a bool, got {value!r}")
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"HacpoConfig.{f.name} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"HacpoConfig.{f.name} must be finite, got {value!r}")
        _check(self.self_clip_low > 0 and self.self_clip_low < 1, "self_clip_low", self.self_clip_low, "in (0, 1)")
        _check(self.self_clip_high > 0, "self_clip_high", self.self_clip_high, "> 0")
        _check(0 < self.cross_clip_delta < 1, "cross_clip_delta", self.cross_clip_delta, "in (0, 1)")
        _check(self.cross_clip_step >= 0, "cross_clip_step", self.cross_clip_step, ">= 0")
        _check(self.alpha >= 0, "alpha", self.alpha, ">= 0")
        _check(
            isinstance(self.capability_window, int) and self.capability_window >= 1,
            "capability_window", self.capability_window, "an integer >= 1",
        )
        _check(self.ratio_min > 0, "ratio_min", self.ratio_min, "> 0")
        _check(self.ratio_max >= self.ratio_min, "ratio_max", self.ratio_max, f">= ratio_min ({self.ratio_min})")
        _check(self.max_abs_log_ratio > 0, "max_abs_log_ratio", self.max_abs_log_ratio, "> 0")
        _check(self.adv_eps > 0, "adv_eps", self.adv_eps, "> 0")
        _check(self.reward_max > 0, "reward_max", self.reward_max, "> 0")
        _check(self.kl_coef >= 0, "kl_coef", self.kl_coef, ">= 0")
        _check(0 < self.grpo_clip_low < 1, "grpo_clip_low", self.grpo_clip_low, "in (0, 1)")
        _check(self.grpo_clip_high > 0, "grpo_clip_high", self.grpo_clip_high, "> 0")
        _check(0.0 <= self.rescue_max_own_reward <= 1.0, "rescue_max_own_reward", self.rescue_max_own_reward,
               "in [0, 1]")
        _check(0.0 <= self.partner_min_byte_prob < 1.0, "partner_min_byte_prob", self.partner_min_byte_prob,
               "in [0, 1)")
        _check(self.trust_rate >= 0, "trust_rate", self.trust_rate, ">= 0")
        _check(0 < self.trust_target <= 1, "trust_target", self.trust_target, "in (0, 1]")
        _check(0 < self.trust_floor <= 1, "trust_floor", self.trust_floor, "in (0, 1]")
        _check(isinstance(self.guide_samples, int) and 0 <= self.guide_samples <= GUIDE_MAX_SAMPLES,
               "guide_samples", self.guide_samples, f"an integer in [0, {GUIDE_MAX_SAMPLES}]")
        _check(0.0 <= self.guide_max_own_reward < 1.0, "guide_max_own_reward", self.guide_max_own_reward, "in [0, 1)")
        changed = [name for name in ABLATION_FLAGS if getattr(self, name) is not True]
        if self.mode not in HACPO_FAMILY and changed:
            raise ValueError(
                f"HacpoConfig: ablation flag(s) {changed} only apply to modes {HACPO_FAMILY}, not {self.mode!r}"
            )
        extended = [name for name, choices in EXTENSION_CHOICES.items() if getattr(self, name) != choices[0]]
        extended += [name for name, default in {**PARTNER_RULE_DEFAULTS, **GUIDE_DEFAULTS}.items()
                     if getattr(self, name) != default]
        if self.mode != "xhacpo" and extended:
            raise ValueError(f"HacpoConfig: {extended} only apply to mode 'xhacpo' (mode {self.mode!r} is paper-exact)")
        self._check_guide()

    def _check_guide(self) -> None:
        """Guided rollouts' settings mean something only with guide_samples > 0; partners used in
        context only leave no partner sample in the update for the partner rules to judge."""
        off = {"guide_max_own_reward": GUIDE_DEFAULTS["guide_max_own_reward"],
               **{name: EXTENSION_CHOICES[name][0] for name in GUIDE_CHOICES}}
        guide = [name for name, default in off.items() if getattr(self, name) != default]
        if self.guide_samples == 0 and guide:
            raise ValueError(f"HacpoConfig: {guide} only apply with guide_samples > 0 (guided rollouts are off)")
        rules = [name for name, default in PARTNER_RULE_DEFAULTS.items() if getattr(self, name) != default]
        if self.partner_use == "context" and rules:
            raise ValueError(f"HacpoConfig: partner_use 'context' leaves no partner sample in the update, so "
                             f"{rules} cannot apply")

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict) -> "HacpoConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown HacpoConfig field(s): {unknown}")
        return cls(**data)


def _check(ok: bool, name: str, value: object, requirement: str) -> None:
    if not ok:
        raise ValueError(f"HacpoConfig.{name} must be {requirement}, got {value!r}")
