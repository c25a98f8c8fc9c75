"""What one expression and one submission may cost the verifier (security.md N3).

An answer whose value is too big to evaluate (`\\boxed{9^{9^{9^{9}}}}`: sympy computes integer
powers in C code no signal interrupts, 5 s to the sandbox's wall timeout) scores 0 before any
worker sees it; a submission whose verification outlasts `verify_budget_s` is refused whole with
HACFED-E-VERIFY-BUDGET and a strike, and its samples past the budget are never sent to a worker.
No time is asserted here; bench/verify_cost.py measures it (docs/results.md).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from hacfed.messages import RoundPlan, Submission
from hacfed.server.coordinator.errors import STRIKE_CODES, ErrorCode
from hacfed.server.coordinator.reward_verification import start_verified_rewards
from hacfed.tasks.base import Verdict
from hacfed.tasks.math_answers import size_refusal
from hacfed.tasks.math_data import MathDataTask
from hacfed.tasks.math_verifier import MathVerifier, MathVerifierConfig
from hacfed.tasks.sandbox import SandboxLimits
from hacfed.tasks.verify_budget import VerifyBudgetSpent
from hacfed.trajectory import Trajectory
from tests.unit.test_coordinator_fakes import TASK, make_coordinator

TOWER = "\\boxed{9^{9^{9^{9}}}}"
LIMITS = dict(max_exponent=10_000, max_factorial=10_000, max_integer_digits=40, max_value_digits=100_000)


@pytest.mark.parametrize("answer", [
    "9^{9^{9^{9}}}", "9^{9^{9}}", "10^{10^{10}}", "9^{9999999}", "99999^{99999}", "9^{9 ^ {9}}", "9^9^9",
    "(10^{10})!", "99999!", "(9^{9999})^{9999}", "1" * 41, "2^{(9)(9)(9)(9)(9)}",
])
def test_size_refusal_refuses_what_could_take_seconds_to_evaluate(answer: str) -> None:
    assert size_refusal(answer, **LIMITS) is not None


@pytest.mark.parametrize("answer", [
    "72", "-5", "3.14159", "\\frac{1}{2}", "e^{-x^2}", "x^{n+1}", "2^{2^{10}}", "9^{9999}", "999!",
    "\\sum_{i=1}^{100} i^2", "\\sqrt[3]{2}", "10^{100}", "123456789012345678901234567890^{9}", "2^{1/2}",
])
def test_size_refusal_passes_ordinary_answers(answer: str) -> None:
    assert size_refusal(answer, **LIMITS) is None


def test_a_tower_scores_zero_in_process_without_a_worker() -> None:
    with MathVerifier(MathVerifierConfig()) as verifier:
        verdict = verifier.verify("72", f"So the answer is {TOWER}.")
        assert verdict.reward == 0.0 and "refused: answer holds an exponent" in verdict.reason
        assert verifier.worker_calls == 0 and verifier.worker_starts == 0


def _toy_task(tmp_path: Path, **verifier: object) -> MathDataTask:
    records = [{"question": f"What is {i} plus {i}?", "answer": f"#### {2 * i}"} for i in range(1, 6)]
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in records))
    test.write_text(json.dumps({"question": "Half of 1?", "answer": "#### 0.5"}) + "\n")
    config = MathVerifierConfig(**verifier)  # type: ignore[arg-type]
    return MathDataTask(name="toy", train_files=(str(train),), eval_files=(str(test),), verifier=config)


def _samples(plan: RoundPlan, pid: str, texts: list[str], reward: float) -> tuple[Trajectory, ...]:
    prompt = plan.prompts[0]
    return tuple(Trajectory(
        trajectory_id=f"{pid}/{plan.round_id}/{i}", prompt_id=prompt.prompt_id, source_id=pid, policy_version=0,
        prompt=prompt.messages, response_text=text, reward=reward, source_logp_sum=-1.0, source_token_count=4,
        finish_reason="stop") for i, text in enumerate(texts))


def _tower_round(tmp_path: Path, task: MathDataTask, texts: list[str], reward: float, **overrides: object):
    coord = make_coordinator(tmp_path / "state", task=task, prompts_per_round=1, group_size=16,
                             expected_participants=1, verify_threads=2, **overrides)
    coord.register("lab-a")
    plan = coord.open_round(0)
    sub = Submission(plan.run_id, "lab-a", 0, _samples(plan, "lab-a", texts, reward))
    return coord, coord.submit(sub)


def test_a_16_sample_tower_submission_scores_zero_and_a_claimed_one_is_a_strike(tmp_path: Path) -> None:
    task = _toy_task(tmp_path)
    try:
        coord, result = _tower_round(tmp_path / "zero", task, [TOWER] * 16, 0.0)
        assert len(result.accepted_ids) == 16 and not result.rejected
        assert coord.journal.accepted_rewards(0) == [("lab-a", 0.0)] * 16
        coord, result = _tower_round(tmp_path / "one", task, [TOWER] * 16, 1.0)
        assert {r.code for r in result.rejected} == {ErrorCode.REWARD_MISMATCH}
        assert coord.journal.count_strikes("lab-a", 0) == 16
        assert task.worker_calls == 0  # decided in process: no worker time spent
    finally:
        task.close()


def test_a_submission_over_its_verify_budget_is_refused_with_a_strike(tmp_path: Path) -> None:
    # The size screen opened wide so that the towers reach math-verify; each runs into the 1 s timeout.
    task = _toy_task(tmp_path, max_exponent=10**12, max_value_digits=10**12, parallel_workers=2,
                     sandbox=SandboxLimits(timeout_s=1.0))
    texts = [f"\\boxed{{9^{{9^{{9}}}}+{i}}}" for i in range(16)]  # distinct: no request is shared
    try:
        coord, result = _tower_round(tmp_path, task, texts, 0.0, verify_budget_s=0.5)
        assert not result.accepted_ids
        assert [r.code for r in result.rejected] == [ErrorCode.VERIFY_BUDGET]
        assert "over the budget of 0.5 s" in result.rejected[0].detail
        assert ErrorCode.VERIFY_BUDGET in STRIKE_CODES and coord.journal.count_strikes("lab-a", 0) == 1
        assert task.worker_calls <= 2  # one request per worker, then nothing more was sent
    finally:
        task.close()


class SlowTask:
    """The arithmetic task, each verification taking 50 ms, counting them."""

    name = TASK.name

    def __init__(self) -> None:
        self.calls = 0

    def verify(self, problem, response: str) -> Verdict:
        self.calls += 1
        time.sleep(0.05)
        return TASK.verify(problem, response)


def test_item_by_item_verification_stops_at_the_budget() -> None:
    problem = TASK.train_problems()[0]
    sample = Trajectory(trajectory_id="t", prompt_id=problem.prompt_id, source_id="a", policy_version=0,
                        prompt=problem.messages, response_text=problem.answer, reward=1.0, source_logp_sum=-1.0,
                        source_token_count=1, finish_reason="stop")
    items = [(problem, sample)] * 10
    task = SlowTask()
    done = start_verified_rewards(task, items, threads=1, budget_s=0.01)  # type: ignore[arg-type]
    with pytest.raises(VerifyBudgetSpent, match="over the budget of 0.01 s"):
        done()
    assert task.calls == 1
    assert start_verified_rewards(SlowTask(), items[:2], threads=1, budget_s=None)() == [1.0, 1.0]  # type: ignore[arg-type]
