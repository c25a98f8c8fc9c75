"""A lab's participant: owns model, tokenizer, optimizer, reference policy and checkpoints.

One exchange per round (design.md): `step(update)` trains on the pool of round r, evaluates when the
next plan asks for it, rolls out plan r+1 with the updated policy and returns the submission.

    from hacfed.clients.participant import Participant, ParticipantConfig
    p = Participant.from_spec(ParticipantConfig("lab-a", "tiny-llama"), task)
    submission = p.step(update)
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import secrets
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from hacfed.clients.checkpoints import latest_checkpoint, read_state, save_checkpoint
from hacfed.clients.update import (
    UpdateSettings, adapter_disabled_reference, default_minibatch, frozen_copy_reference, hacpo_update,
)
from hacfed.messages import RoundPlan, RoundUpdate, StepReport, Submission
from hacfed.rollout.hf import evaluate_accuracy, generate
from hacfed.tasks.base import Task
from hacfed.trajectory import Trajectory


@dataclass(frozen=True)
class ParticipantConfig:
    """Local choices of one lab; everything that must agree comes from the coordinator's plan."""

    participant_id: str
    model: str
    finetune: Literal["full", "lora"] = "full"
    lora_rank: int = 8
    lora_alpha: int = 16
    learning_rate: float = 5e-5  # tiny full-FT models; the paper's 1e-6 is for 1.7B-8B models
    minibatch_size: int | None = None  # None: prompts × G / 2 of the pool (the paper's 2 updates per source)
    max_grad_norm: float = 1.0
    max_prompt_len: int = 128
    max_response_len: int = 64
    eval_problems: int = 200
    rollout_batch_size: int = 256
    device: str = "cpu"
    seed: int = 0
    checkpoint_dir: str | None = None
    rollout_backend: Literal["hf", "vllm"] = "hf"

    def __post_init__(self) -> None:
        if not self.participant_id or not isinstance(self.participant_id, str):
            raise ValueError(f"participant_id must be a non-empty string, got {self.participant_id!r}")
        if self.finetune not in ("full", "lora"):
            raise ValueError(f"finetune must be 'full' or 'lora', got {self.finetune!r}")
        if not (self.learning_rate > 0 and math.isfinite(self.learning_rate)):
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate!r}")
        if self.minibatch_size is not None and self.minibatch_size < 1:
            raise ValueError(f"minibatch_size must be >= 1, got {self.minibatch_size!r}")
        if self.rollout_backend not in ("hf", "vllm"):
            raise ValueError(f"rollout_backend must be 'hf' or 'vllm', got {self.rollout_backend!r}")
        if self.eval_problems < 1:
            raise ValueError(f"eval_problems must be >= 1, got {self.eval_problems!r}")


@dataclass
class RoundTimings:
    rollout_s: float = 0.0
    training_s: float = 0.0
    eval_s: float = 0.0
    checkpoint_s: float = 0.0


class Participant:
    def __init__(self, cfg: ParticipantConfig, model: Any, tokenizer: Any, task: Task) -> None:
        self.cfg = cfg
        self.task = task
        self.tokenizer = tokenizer
        torch.manual_seed(cfg.seed)
        model.to(cfg.device)
        if cfg.finetune == "lora":
            from peft import LoraConfig, get_peft_model

            lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=0.0, target_modules="all-linear")
            self.model = get_peft_model(model, lora)
            self._reference = lambda: adapter_disabled_reference(self.model)
        else:
            self.model = model
            ref = copy.deepcopy(model).eval()
            for p in ref.parameters():
                p.requires_grad_(False)
            self._reference = lambda: frozen_copy_reference(ref)
        self.model.eval()
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=0.0)
        self.policy_version = 0
        self.last_round: int | None = None  # the last plan rolled out
        self.capabilities: dict[str, float] = {}
        self.timings = RoundTimings()
        self._eval_max_new_tokens = 16  # the last plan's max_new_tokens, for the final evaluation
        self._own: dict[str, Trajectory] = {}  # own trajectories of the last rollout, with local ids
        self._vllm = None
        if cfg.checkpoint_dir:
            self._maybe_resume(Path(cfg.checkpoint_dir))
        if cfg.rollout_backend == "vllm":
            from hacfed.rollout.vllm_backend import VllmRollout

            self._vllm = VllmRollout(str(self._export_for_vllm()))

    @classmethod
    def from_spec(cls, cfg: ParticipantConfig, task: Task) -> "Participant":
        from hacfed.models.loading import load_model

        loaded = load_model(cfg.model, device=cfg.device)
        return cls(cfg, loaded.model, loaded.tokenizer, task)

    @property
    def participant_id(self) -> str:
        return self.cfg.participant_id

    # --- the round -----------------------------------------------------------------------------

    def step(self, update: RoundUpdate) -> Submission:
        """Train on the pool, evaluate if asked, roll out the next plan, checkpoint."""
        self.timings = RoundTimings()
        metrics: dict[str, float] = {}
        self.capabilities = dict(update.capabilities)
        if update.pool:
            t0 = time.perf_counter()
            metrics.update(self.train_on_pool(update))
            self.timings.training_s = time.perf_counter() - t0
        plan = update.next_plan
        if plan is not None and plan.sampling.max_new_tokens + 1 > self.cfg.max_response_len:
            raise ValueError(
                f"the plan asks for up to {plan.sampling.max_new_tokens} new tokens but max_response_len is "
                f"{self.cfg.max_response_len}: raise max_response_len to at least {plan.sampling.max_new_tokens + 1}"
            )
        eval_accuracy = None
        # Evaluate when the plan asks, and always after training on the final pool (no plan).
        if (plan is not None and plan.evaluate) or (plan is None and update.pool):
            t0 = time.perf_counter()
            eval_accuracy = self.evaluate(plan.sampling.max_new_tokens if plan else self._eval_max_new_tokens)
            self.timings.eval_s = time.perf_counter() - t0
        trajectories: tuple[Trajectory, ...] = ()
        if plan is not None:
            t0 = time.perf_counter()
            trajectories = self.rollout(plan)
            self.timings.rollout_s = time.perf_counter() - t0
            rewards = [t.reward for t in trajectories]
            metrics["reward_mean"] = sum(rewards) / max(len(rewards), 1)
            self.last_round = plan.round_id
            self._eval_max_new_tokens = plan.sampling.max_new_tokens
        if self.cfg.checkpoint_dir:
            t0 = time.perf_counter()
            self.save(Path(self.cfg.checkpoint_dir))
            self.timings.checkpoint_s = time.perf_counter() - t0
        metrics.update({f"time_{k}": v for k, v in asdict(self.timings).items()})
        # The submission answers plan r (or, after the last round, closes the run as round R).
        round_id = plan.round_id if plan is not None else (update.pool_round or 0) + 1
        report = StepReport(self.participant_id, round_id, metrics, eval_accuracy)
        return Submission(
            run_id=update.run_id,
            participant_id=self.participant_id,
            round_id=round_id,
            trajectories=tuple(t.without_local_ids() for t in trajectories),
            report=report,
            nonce=secrets.token_hex(16),  # replay defence (security.md T4); resends reuse the object
            created_at_ms=int(time.time() * 1000),
        )

    def train_on_pool(self, update: RoundUpdate) -> dict[str, float]:
        # Own samples keep the exact sampled ids from our rollout (the pool carries text only).
        # The pool's reward is the coordinator's verified one; only the ids come from the local cache.
        pool = [self._with_local_ids(t) for t in update.pool]
        minibatch = self.cfg.minibatch_size or default_minibatch(pool)
        settings = UpdateSettings(minibatch, self.cfg.max_grad_norm, self.cfg.max_prompt_len, self.cfg.max_response_len)
        agents = update.participants or tuple(sorted({t.source_id for t in pool}))
        metrics = hacpo_update(
            self.model, self.tokenizer, self.optimizer, self._reference, pool, self.participant_id,
            agents, self.capabilities, update.hacpo, settings,
        )
        if metrics.get("num_updates", 0) > 0:
            self.policy_version += 1
        if self._vllm is not None:
            # vLLM serves weights from disk: hand it the updated policy, or ratios go stale.
            self._vllm.reload(str(self._export_for_vllm()))
        return metrics

    def _export_for_vllm(self) -> Path:
        if not self.cfg.checkpoint_dir:
            raise ValueError("rollout_backend 'vllm' needs checkpoint_dir (vLLM loads the policy from disk)")
        target = Path(self.cfg.checkpoint_dir) / "vllm-policy"
        model = self.model
        if self.cfg.finetune == "lora":
            # Merge a copy: the live model keeps its adapter for training.
            model = copy.deepcopy(self.model).merge_and_unload()
        model.save_pretrained(target)
        self.tokenizer.save_pretrained(target)
        return target

    def _with_local_ids(self, t: Trajectory) -> Trajectory:
        local = self._own.get(t.trajectory_id) if t.source_id == self.participant_id else None
        if local is None or local.response_text != t.response_text or local.source_token_count != t.source_token_count:
            return t
        return Trajectory(**{**t.__dict__, "response_token_ids": local.response_token_ids})

    def evaluate(self, max_new_tokens: int) -> float:
        problems = list(self.task.eval_problems())[: self.cfg.eval_problems]
        return evaluate_accuracy(self.model, self.tokenizer, self.task, problems, max_new_tokens=max_new_tokens)

    def rollout(self, plan: RoundPlan) -> tuple[Trajectory, ...]:
        """G samples per planned prompt at the plan's sampling settings; rewards are local claims."""
        seed = _derive_seed(self.cfg.seed, plan.run_id, plan.round_id, self.participant_id)
        prompts = [p.messages for p in plan.prompts]
        kwargs = dict(
            num_samples=plan.group_size, max_new_tokens=plan.sampling.max_new_tokens,
            temperature=plan.sampling.temperature, top_p=plan.sampling.top_p, seed=seed,
        )
        if self._vllm is not None:
            groups = self._vllm.generate(self.model, self.tokenizer, prompts, **kwargs)
        else:
            groups = generate(self.model, self.tokenizer, prompts, batch_size=self.cfg.rollout_batch_size, **kwargs)
        out: list[Trajectory] = []
        for planned, completions in zip(plan.prompts, groups):
            problem = self.task.problem(planned.prompt_id)
            for k, c in enumerate(completions):
                out.append(
                    Trajectory(
                        trajectory_id=f"{plan.run_id}/r{plan.round_id}/{self.participant_id}/{planned.prompt_id}/{k}",
                        prompt_id=planned.prompt_id,
                        source_id=self.participant_id,
                        policy_version=self.policy_version,
                        prompt=planned.messages,
                        response_text=c.text,
                        reward=float(self.task.verify(problem, c.text).reward),
                        source_logp_sum=min(float(c.logprob_sum), 0.0),
                        source_token_count=len(c.token_ids),
                        finish_reason=c.finish_reason,
                        response_token_ids=tuple(int(i) for i in c.token_ids),
                    )
                )
        self._own = {t.trajectory_id: t for t in out}
        return tuple(out)

    # --- checkpoints -----------------------------------------------------------------------------

    def save(self, directory: Path) -> Path:
        round_id = self.last_round if self.last_round is not None else -1

        def write(tmp: Path) -> None:
            torch.save(_trainable_state(self.model), tmp / "model.pt")
            torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
            torch.save({"torch": torch.get_rng_state()}, tmp / "rng.pt")
            own = [_trajectory_record(t) for t in self._own.values()]
            state = {
                "participant_id": self.participant_id,
                "round": round_id,
                "policy_version": self.policy_version,
                "capabilities": self.capabilities,
                "config": asdict(self.cfg),
                "own_trajectories": own,
            }
            (tmp / "state.json").write_text(json.dumps(state))

        return save_checkpoint(directory, max(round_id, 0), write)

    def _maybe_resume(self, directory: Path) -> None:
        path = latest_checkpoint(directory)
        if path is None:
            return
        state = read_state(path)
        if state["participant_id"] != self.participant_id:
            raise ValueError(
                f"checkpoint {path} belongs to {state['participant_id']!r}, not {self.participant_id!r}"
            )
        self.model.load_state_dict(torch.load(path / "model.pt", weights_only=True), strict=False)
        self.optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
        torch.set_rng_state(torch.load(path / "rng.pt", weights_only=True)["torch"])
        self.policy_version = int(state["policy_version"])
        self.last_round = None if state["round"] < 0 else int(state["round"])
        self.capabilities = {k: float(v) for k, v in state["capabilities"].items()}
        self._own = {r["trajectory_id"]: _trajectory_from_record(r) for r in state["own_trajectories"]}


def _trainable_state(model: Any) -> dict[str, torch.Tensor]:
    """Full weights for full fine-tuning; only the adapter (trainable) tensors for LoRA."""
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items() if k in trainable or not trainable}


def _derive_seed(seed: int, run_id: str, round_id: int, participant: str) -> int:
    digest = hashlib.sha256(f"{seed}|{run_id}|{round_id}|{participant}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def _trajectory_record(t: Trajectory) -> dict:
    record = {k: getattr(t, k) for k in t.__dataclass_fields__ if k not in ("prompt", "response_token_ids")}
    record["prompt"] = [[m.role, m.content] for m in t.prompt]
    record["response_token_ids"] = list(t.response_token_ids or ())
    return record


def _trajectory_from_record(record: dict) -> Trajectory:
    from hacfed.trajectory import ChatMessage

    data = dict(record)
    data["prompt"] = tuple(ChatMessage(r, c) for r, c in data["prompt"])
    data["response_token_ids"] = tuple(data["response_token_ids"])
    return Trajectory(**data)

