"""The labs' side of the coordinator scale bench (bench/coordinator_scale.py): its configuration,
the synthetic GSM8K-shaped replies every lab sends in every round, written to disk before anything
is timed, and the ids they carry (to check the journal against).
"""

from __future__ import annotations

import random
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RUN_ID = "coordinator-scale"
_CALC = re.compile(r"<<[^<>]*>>")


@dataclass(frozen=True)
class ScaleConfig:
    """One point of the bench: `labs` labs, each submitting prompts x group_size trajectories in
    each of `rounds` rounds (round 0 has no pool to build, so the medians use rounds 1..R-1)."""

    labs: int
    prompts: int = 125
    group_size: int = 8
    rounds: int = 4
    seed: int = 0
    correct_fraction: float = 0.35
    nonplain_fraction: float = 0.02  # non-plain answers: \$N (fast path), N\text{ units}, N\% (math-verify)
    replies_per_pull: int = 8  # how many labs' replies one pull of the ServerApp's round loop brings

    def __post_init__(self) -> None:
        for name in ("labs", "prompts", "group_size", "rounds", "replies_per_pull"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ScaleConfig.{name} must be an int >= 1, got {value!r}")
        if self.rounds < 2:
            raise ValueError(f"ScaleConfig.rounds must be >= 2 (round 0 builds no pool), got {self.rounds}")
        for name in ("correct_fraction", "nonplain_fraction"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"ScaleConfig.{name} must be in [0, 1], got {value!r}")

    @property
    def per_lab(self) -> int:
        return self.prompts * self.group_size


def lab_ids(n: int) -> list[str]:
    return [f"lab-{i:03d}" for i in range(n)]


def coordinator_settings(cfg: ScaleConfig, work: Path) -> dict[str, Any]:
    """The CoordinatorConfig mapping of the run: GSM8K from the shipped files, a quorum of all labs."""
    import hacfed

    data = Path(hacfed.__file__).resolve().parent / "data" / "gsm8k"
    return {
        "run_id": RUN_ID, "rounds": cfg.rounds, "prompts_per_round": cfg.prompts, "group_size": cfg.group_size,
        "expected_participants": cfg.labs, "min_participants": cfg.labs, "round_deadline_s": 3600.0,
        "state_dir": str(work / "server"), "eval_every": 0, "seed": cfg.seed,
        "sampling": {"max_new_tokens": 512},
        "task": {"kind": "jsonl", "name": "gsm8k", "train_files": [str(data / "train.jsonl")],
                 "eval_files": [str(data / "test.jsonl")], "answer_format": "gsm8k",
                 "cache_dir": str(work / "hf-cache")},
    }


def synthetic_response(rng: random.Random, solution: str, answer: str, correct: bool, nonplain: bool) -> str:
    """A GSM8K-shaped model response: worked steps (the reference reasoning without its calculator
    annotations, with a model-like preamble and closing) and a final `\\boxed{}` answer."""
    reasoning = _CALC.sub("", solution.rsplit("The final answer is", 1)[0]).strip()
    final = answer
    if not correct:
        try:
            final = str(int(answer) + rng.choice((-10, -2, -1, 1, 2, 3, 10)))
        except ValueError:
            final = answer + "1"
    if nonplain:
        final = rng.choice((f"\\${final}", f"{final}\\text{{ units}}", f"{final}\\%"))
    opener = rng.choice(("Let's think step by step.", "Let me work through this carefully.",
                         "We solve the problem one step at a time."))
    closing = rng.choice(("So the answer is", "Therefore, the final answer is", "Putting it together, we get"))
    return f"{opener}\n{reasoning}\nLet me double-check the arithmetic once more.\n{closing} \\boxed{{{final}}}."


def generate(cfg: ScaleConfig, work: Path) -> dict[str, Any]:
    """Keys, the server config and every lab's signed reply of every round, written under `work`.
    Returns what was submitted (counts, bytes) for the report."""
    from hacfed.envelope import DOMAIN_SUBMIT, save_public_key, seal
    from hacfed.exchange import seal_lab_reply
    from hacfed.keys import ensure_key_pair
    from hacfed.messages import StepReport, Submission
    from hacfed.server.config import ServerConfig, ServerSettings, write_server_config
    from hacfed.server.coordinator import CoordinatorConfig, load_task_from_config, make_plan
    from hacfed.trajectory import Trajectory
    from hacfed.wire import PayloadType, encode_submission

    ccfg = CoordinatorConfig.from_mapping(coordinator_settings(cfg, work))
    task = load_task_from_config(ccfg)
    state = Path(ccfg.state_dir)
    keys_dir = state / "keys"
    keys_dir.mkdir(parents=True, exist_ok=True)
    ensure_key_pair(state, "coordinator")  # the key FederationDriver signs with
    write_server_config(ServerConfig(ccfg, ServerSettings(insecure=True), state), work / "driver-settings.json")
    rng = random.Random(cfg.seed)
    reply_bytes = 0
    labs = lab_ids(cfg.labs)
    keys = {}
    for pid in labs:
        pair = ensure_key_pair(work / "labs" / pid, "participant")
        keys[pid] = pair.load()
        save_public_key(keys[pid].public_key(), keys_dir / f"{pid}.pub")
    acks = work / "replies" / "ack"  # each lab's reply to an answers-only delivery: no submission
    acks.mkdir(parents=True, exist_ok=True)
    for pid in labs:
        (acks / f"{pid}.bin").write_bytes(seal_lab_reply(b"", (), keys[pid]))
    for round_id in range(cfg.rounds):
        plan = make_plan(ccfg, task, round_id)
        folder = work / "replies" / str(round_id)
        folder.mkdir(parents=True, exist_ok=True)
        for pid in labs:
            trajectories = []
            for prompt in plan.prompts:
                problem = task.problem(prompt.prompt_id)
                for i in range(plan.group_size):
                    correct = rng.random() < cfg.correct_fraction
                    text = synthetic_response(rng, problem.solution, problem.answer, correct,
                                              rng.random() < cfg.nonplain_fraction)
                    tokens = max(1, len(text) // 4)
                    trajectories.append(Trajectory(
                        trajectory_id=f"{pid}/{round_id}/{prompt.prompt_id}/{i}", prompt_id=prompt.prompt_id,
                        source_id=pid, policy_version=round_id, prompt=prompt.messages, response_text=text,
                        reward=task.verify(problem, text).reward,  # the lab's own claim, honest
                        source_logp_sum=-tokens * rng.uniform(0.05, 0.9), source_token_count=tokens,
                        finish_reason="stop",
                    ))
            metrics = {"loss": rng.uniform(0.1, 1.0), "time_rollout_s": 30.0, "time_training_s": 60.0}
            report = StepReport(pid, max(round_id - 1, 0), metrics, None)
            sub = Submission(RUN_ID, pid, round_id, tuple(trajectories), report, nonce=secrets.token_hex(16),
                             created_at_ms=int(time.time() * 1000))
            sealed = seal(encode_submission(sub), PayloadType.SUBMISSION, keys[pid], DOMAIN_SUBMIT)
            reply = seal_lab_reply(sealed, (), keys[pid])
            (folder / f"{pid}.bin").write_bytes(reply)
            reply_bytes += len(reply)
    task.close()
    return {"labs": cfg.labs, "trajectories_per_lab": cfg.per_lab, "rounds": cfg.rounds,
            "reply_bytes_per_lab_round": reply_bytes / (cfg.labs * cfg.rounds)}


def submitted_ids(work: Path, cfg: ScaleConfig) -> list[str]:
    """Every trajectory id in the generated replies, as `participant trajectory` (for the check)."""
    from hacfed.envelope import DOMAIN_SUBMIT, key_id, load_public_key, open_envelope
    from hacfed.exchange import open_lab_reply
    from hacfed.wire import PayloadType, decode_submission

    keys = {}
    for pid in lab_ids(cfg.labs):
        public = load_public_key(work / "server" / "keys" / f"{pid}.pub")
        keys[key_id(public)] = public
    out = []
    for round_id in range(cfg.rounds):
        for pid in lab_ids(cfg.labs):
            reply, _ = open_lab_reply((work / "replies" / str(round_id) / f"{pid}.bin").read_bytes(), keys)
            body, _ = open_envelope(reply.submission, keys, DOMAIN_SUBMIT, PayloadType.SUBMISSION)
            out.extend(f"{pid} {t.trajectory_id}" for t in decode_submission(body).trajectories)
    return sorted(out)
