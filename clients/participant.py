"""A lab's participant: owns model, tokenizer, optimizer, reference policy and checkpoints.

Runs in a lab's hacfed-client process, resident for the whole run (and in `hacfed sim`, one per
agent). One exchange per round (docs/design.md): `step(update)` trains on the pool of round r, evaluates
when the next plan asks for it, rolls out plan r+1 with the updated policy and returns the
submission. The parts live beside it: `participant_config` (the lab's training choices,
`ParticipantConfig`, re-exported here), `rollout_and_eval` (sampling a plan, held-out accuracy),
`training` (policy, reference, optimizer, training on the pool; the HACPO update is `update`) and
`checkpoints` (atomic save and resume).

    from hacfed.clients.participant import Participant, ParticipantConfig
    p = Participant.from_spec(ParticipantConfig("lab-a", "tiny-llama"), task)
    submission = p.step(update)
"""

from __future__ import annotations

import secrets
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from hacfed.clients.answer_form import AnswerFormDrift
from hacfed.clients.checkpoints import restore_participant, save_participant
from hacfed.clients.context import model_context, readable_pool
from hacfed.clients.guided import GuidedBatch, check_task, guide_active, guided_rollouts, sampler_for, training_pool
from hacfed.clients.participant_config import ParticipantConfig
from hacfed.clients.rollout_and_eval import Evaluation, derive_seed, evaluate_held_out, export_for_vllm, rollout_plan
from hacfed.clients.textfilter import filter_pool, filters_for, withhold_groups
from hacfed.clients.training import prepare_training, train_on_pool
from hacfed.clients.trust import PartnerTrust
from hacfed.messages import RoundPlan, RoundUpdate, SamplingParams, StepReport, Submission
from hacfed.models.memory import apply_memory_plan, bf16_supported, memory_plan, microbatch_token_cap
from hacfed.tasks.base import Task
from hacfed.trajectory import Trajectory


@dataclass
class RoundTimings:
    rollout_s: float = 0.0
    training_s: float = 0.0
    eval_s: float = 0.0
    checkpoint_s: float = 0.0


def truncated_fraction(trajectories: Sequence[Trajectory]) -> float:
    """The fraction of responses cut at the budget (finish reason "length"); 0 for none."""
    if not trajectories:
        return 0.0
    return sum(t.finish_reason == "length" for t in trajectories) / len(trajectories)


def own_verified_rewards(pool: Sequence[Trajectory], participant_id: str) -> dict[str, float]:
    """{"own_verified_reward_mean": ...} of the learner's own samples in a pool (the coordinator's
    verified rewards of its previous round); {} when the pool holds none of them."""
    own = [t.reward for t in pool if t.source_id == participant_id]
    return {"own_verified_reward_mean": sum(own) / len(own)} if own else {}


class Participant:
    def __init__(self, cfg: ParticipantConfig, model: Any, tokenizer: Any, task: Task) -> None:
        self.cfg = cfg
        self.task = task
        self.tokenizer = tokenizer
        torch.manual_seed(cfg.seed)
        self.memory = memory_plan(model.num_parameters(), cfg.device, bf16=bf16_supported(cfg.device),
                                  finetune=cfg.finetune)
        cfg = replace(cfg, finetune=self.memory.finetune)
        apply_memory_plan(model, self.memory)
        model.to(cfg.device)
        self.context = model_context(model)  # prompt + response of a sample it trains on fit in it
        self._explicit_response_len = cfg.max_response_len is not None
        cfg = replace(cfg, max_prompt_len=cfg.max_prompt_len or self.context,
                      max_response_len=cfg.max_response_len or self.context,
                      microbatch_tokens=microbatch_token_cap(model.config, cfg.microbatch_tokens))
        self.cfg = cfg
        self._inbound, self._outbound = filters_for(cfg, task)  # peers' text in, own text out (textfilter)
        self.model, self.reference, self.optimizer = prepare_training(model, cfg)
        self.policy_version = 0
        self.last_round: int | None = None  # the last plan rolled out
        self.last_pool_round: int | None = None  # the pool of the last update answered (trained on)
        self.capabilities: dict[str, float] = {}
        self.timings = RoundTimings()
        self._eval_max_new_tokens = 16  # the last plan's max_new_tokens, for the final evaluation
        self.answer_keys = "public"  # the last plan's (hacfed.messages.ANSWER_KEYS), for the final step
        # own trajectories of the last rollout, with local ids (the data-parallel group and replay read and set it)
        self.own_samples: dict[str, Trajectory] = {}
        self._vllm = None
        self._ranks: Any = None  # hacfed.clients.distributed.RankGroup when training data-parallel
        self.trust = PartnerTrust()  # the lab's own weight of each partner (hacfed.clients.trust)
        self.answer_forms = AnswerFormDrift()  # the form of its answers at its first rollout
        self._pool_temperature: float | None = None  # the sampling temperature of the last rollout
        self._pool_sampling: SamplingParams | None = None  # the last rollout's sampling (guided rollouts use it)
        self._guided: tuple[Trajectory, ...] = ()  # the guided continuations of the update in progress
        if cfg.checkpoint_dir:
            self.resume(Path(cfg.checkpoint_dir))
        if cfg.rollout_backend == "vllm":
            from hacfed.rollout.vllm_backend import VllmRollout

            self._vllm = VllmRollout(str(self._export_for_vllm()))

    @classmethod
    def from_spec(cls, cfg: ParticipantConfig, task: Task) -> "Participant":
        from hacfed.models.loading import load_model

        # Progress bars (a first-use warm-up, weight loading) only on a terminal, never in logs.
        loaded = load_model(cfg.model, device=cfg.device, progress=sys.stderr.isatty())
        participant = cls(cfg, loaded.model, loaded.tokenizer, task)
        if cfg.nproc > 1:  # after a resume, so the other ranks start from the restored state
            from hacfed.clients.distributed import start_ranks, stop_this_process

            participant.attach_ranks(start_ranks(cfg.nproc, [participant], on_failure=stop_this_process))
        return participant

    def attach_ranks(self, ranks: Any) -> None:
        """Train and roll out data-parallel with `ranks` (a started `RankGroup` holding replicas of
        this participant); evaluation and checkpoints stay in this process (rank 0)."""
        self._ranks = ranks

    @property
    def participant_id(self) -> str:
        return self.cfg.participant_id

    # --- the round -----------------------------------------------------------------------------

    def step(self, update: RoundUpdate, before_checkpoint: Callable[[Submission], None] | None = None) -> Submission:
        """Train on the pool, evaluate if asked, roll out the next plan, checkpoint.

        before_checkpoint(submission) runs after the submission is complete and before the
        checkpoint that records this step: the participant service stores the signed submission
        in its outbox there, so that a checkpoint never exists without the reply it produced."""
        # The checkpoint comes after the report (see before_checkpoint): report the previous one's time.
        self.timings = RoundTimings(checkpoint_s=self.timings.checkpoint_s)
        metrics: dict[str, float] = {}
        self.capabilities = dict(update.capabilities)
        if self._pool_temperature is None and update.next_plan is not None:  # a run samples at one temperature
            self._pool_temperature = update.next_plan.sampling.temperature
        if self._pool_sampling is None and update.next_plan is not None:
            self._pool_sampling = update.next_plan.sampling
        if update.pool:
            t0 = time.perf_counter()
            metrics.update(self.train_on_pool(update))
            self.timings.training_s = time.perf_counter() - t0
        plan = update.next_plan
        keys = plan.answer_keys if plan is not None else self.answer_keys
        if keys == "coordinator":  # no local claims: the previous round's rewards, verified, from the pool
            metrics.update(own_verified_rewards(update.pool, self.participant_id))
        budget = None if plan is None else plan.sampling.max_new_tokens
        if self._explicit_response_len and budget is not None and budget + 1 > self.cfg.max_response_len:
            raise ValueError(
                f"the plan asks for up to {plan.sampling.max_new_tokens} new tokens but max_response_len is "
                f"{self.cfg.max_response_len}: raise max_response_len to at least {plan.sampling.max_new_tokens + 1}, "
                "or leave it unset (the model's context)"
            )
        eval_accuracy = None
        # Evaluate when the plan asks, and always after training on the final pool (no plan).
        if (plan is not None and plan.evaluate) or (plan is None and update.pool):
            t0 = time.perf_counter()
            scores = self.evaluate(plan.sampling.max_new_tokens if plan else self._eval_max_new_tokens)
            self.timings.eval_s = time.perf_counter() - t0
            eval_accuracy = scores.greedy
            if scores.pass1 is not None:
                metrics["eval_pass1"] = scores.pass1
            metrics.update({f"eval_greedy/{half}": value for half, value in scores.greedy_by_half.items()})
        trajectories: tuple[Trajectory, ...] = ()
        if plan is not None:
            t0 = time.perf_counter()
            trajectories = self.rollout(plan)
            self.timings.rollout_s = time.perf_counter() - t0
            if plan.answer_keys == "public":  # local claims; none when the coordinator holds the answers
                metrics["reward_mean"] = sum(t.reward for t in trajectories) / max(len(trajectories), 1)
            metrics["rollout_truncated_frac"] = truncated_fraction(trajectories)
            form_share = self.answer_forms.observe(t.response_text for t in trajectories)
            if form_share is not None:
                metrics["answer_form_start_share"] = form_share
            self._pool_temperature = plan.sampling.temperature
            self._pool_sampling = plan.sampling
            trajectories, withheld = withhold_groups(trajectories, self._outbound)
            metrics["withheld_outbound"] = float(withheld)
            self.last_round = plan.round_id
            self.answer_keys = plan.answer_keys
            self._eval_max_new_tokens = plan.sampling.max_new_tokens
        self.last_pool_round = update.pool_round
        metrics.update({f"time_{k}": v for k, v in asdict(self.timings).items()})
        # The submission answers plan r (or, after the last round, closes the run as round R).
        round_id = plan.round_id if plan is not None else (update.pool_round or 0) + 1
        report = StepReport(self.participant_id, round_id, metrics, eval_accuracy)
        submission = Submission(
            run_id=update.run_id,
            participant_id=self.participant_id,
            round_id=round_id,
            trajectories=tuple(t.without_local_ids() for t in trajectories),
            report=report,
            nonce=secrets.token_hex(16),  # replay defence (security.md T4); resends reuse the stored bytes
            created_at_ms=int(time.time() * 1000),
        )
        if before_checkpoint is not None:
            before_checkpoint(submission)
        if self.cfg.checkpoint_dir:
            t0 = time.perf_counter()
            self.save(Path(self.cfg.checkpoint_dir))
            self.timings.checkpoint_s = time.perf_counter() - t0
        return submission

    def train_on_pool(self, update: RoundUpdate) -> dict[str, float]:
        pool, skipped_filter = filter_pool(update.pool, self.participant_id, self._inbound)
        readable = readable_pool(pool, self.participant_id, self.tokenizer, self.context, self.own_samples)
        update = replace(update, pool=readable.pool)
        guided = self._guided_rollouts(update) if guide_active(update.hacpo) else None
        if guided is not None:  # the learner's own hinted continuations join the update (hacfed.clients.guided)
            update = replace(update, pool=training_pool(update.pool, self.participant_id, update.hacpo))
            self._guided = guided.trajectories
        try:
            metrics = self._train(update)
        finally:
            self._guided = ()
        if guided is not None:
            metrics.update(guided.metrics)
        metrics["skipped_context_own"] = float(readable.skipped_own)
        metrics["skipped_context"] = float(readable.skipped_peers)
        metrics["skipped_filter"] = float(skipped_filter)
        return metrics

    def learner_local(self) -> dict[str, Any]:
        """What the update reads from this lab's own state: the pool's sampling temperature, its
        trust in each partner and its guided continuations (keywords of `train_on_pool`)."""
        temperature = self._pool_temperature if self._pool_temperature is not None else 1.0
        return {"temperature": temperature, "trust": self.trust.weights(), "guided": self._guided}

    def _guided_rollouts(self, update: RoundUpdate) -> GuidedBatch:
        """Guided continuations of the prompts the pool shows it fell short on, sampled by the
        pre-update policy at the last rollout's settings."""
        check_task(self.task)
        sampling = self._pool_sampling or SamplingParams(temperature=self.learner_local()["temperature"],
                                                         max_new_tokens=self._eval_max_new_tokens)
        seed = derive_seed(self.cfg.seed, update.run_id, update.pool_round or 0, f"{self.participant_id}/guided")
        sample = sampler_for(self.model, self.tokenizer, sampling, seed, self.cfg.rollout_batch_size, self._vllm)
        return guided_rollouts(
            update.pool, self.participant_id, update.hacpo, self.task, sample, self.tokenizer, context=self.context,
            max_prompt_len=self.cfg.max_prompt_len, max_new_tokens=sampling.max_new_tokens,
            policy_version=self.policy_version, tag=f"{update.run_id}/r{update.pool_round or 0}",
        )

    def _train(self, update: RoundUpdate) -> dict[str, float]:
        if self._ranks is not None:
            metrics = self._ranks.train(self, update)
        else:
            metrics = train_on_pool(
                self.model, self.tokenizer, self.optimizer, self.reference, update,
                learner=self.participant_id, own=self.own_samples, capabilities=self.capabilities, cfg=self.cfg,
                **self.learner_local(),
            )
        if update.hacpo.trust_rate > 0:  # learned from this update, used from the next one on
            self.trust.update(metrics, update.hacpo)
            metrics.update(self.trust.metrics())
        if metrics.get("num_updates", 0) > 0:
            self.policy_version += 1
        if self._vllm is not None:
            # vLLM serves weights from disk: hand it the updated policy, or ratios go stale.
            self._vllm.reload(str(self._export_for_vllm()))
        return metrics

    def _export_for_vllm(self) -> Path:
        return export_for_vllm(self.model, self.tokenizer, self.cfg.checkpoint_dir, self.cfg.finetune)

    def evaluate(self, max_new_tokens: int) -> Evaluation:
        return evaluate_held_out(self.model, self.tokenizer, self.task, self.cfg.eval_problems, max_new_tokens,
                                 split=self.cfg.eval_split, sampled=self.cfg.eval_sampled, seed=self.cfg.seed)

    def rollout(self, plan: RoundPlan) -> tuple[Trajectory, ...]:
        """G samples per planned prompt at the plan's sampling settings; rewards are local claims."""
        if self._ranks is not None:  # each rank samples its share of the prompts (whole groups)
            out = self._ranks.rollout(self, plan)
        else:
            out = rollout_plan(
                self.model, self.tokenizer, self.task, plan, participant_id=self.participant_id,
                policy_version=self.policy_version, base_seed=self.cfg.seed, batch_size=self.cfg.rollout_batch_size,
                vllm=self._vllm,
            )
        self.own_samples = {t.trajectory_id: t for t in out}
        return out

    # --- checkpoints -----------------------------------------------------------------------------

    def save(self, directory: Path, suffix: str = "") -> Path:
        return save_participant(
            directory, keep=self.cfg.keep_checkpoints, suffix=suffix,
            participant_id=self.participant_id, last_round=self.last_round, last_pool_round=self.last_pool_round,
            policy_version=self.policy_version, capabilities=self.capabilities, config=asdict(self.cfg),
            model=self.model, optimizer=self.optimizer, own=self.own_samples, learner_state=self._learner_state(),
        )

    def _learner_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {}
        if self.trust.weights():
            state["trust"] = self.trust.weights()
        if self.answer_forms.start is not None:
            state["answer_form_start"] = self.answer_forms.start
        if self._pool_temperature is not None:
            state["pool_temperature"] = self._pool_temperature
        if self._pool_sampling is not None:
            state["pool_sampling"] = asdict(self._pool_sampling)
        return state

    def resume(self, directory: Path, path: Path | None = None) -> None:
        """Restore weights, optimizer, RNG, own samples and learner state from the newest checkpoint in
        `directory` (or `path`); nothing when there is none."""
        restored = restore_participant(directory, self.participant_id, self.model, self.optimizer, path)
        if restored is None:
            return
        self.policy_version = restored.policy_version
        self.last_round = restored.last_round
        self.last_pool_round = restored.last_pool_round
        self.capabilities = restored.capabilities
        self.own_samples = restored.own
        learned = restored.learner_state
        self.trust = PartnerTrust(learned.get("trust"))
        self.answer_forms = AnswerFormDrift(learned.get("answer_form_start"))
        self._pool_temperature = learned.get("pool_temperature")
        sampling = learned.get("pool_sampling")
        self._pool_sampling = SamplingParams(**sampling) if sampling is not None else None
