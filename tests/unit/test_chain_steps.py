"""A chain success teaches no false arithmetic (docs/security.md, issue 42 N1): the verifier reads every
worked step, so a response whose last line is right but whose steps are false, or whose numbers are
out of the task's range, earns reward 0, the same at the lab (its local claim, `rollout_plan`) and at
the coordinator (its re-verification); the response format holds a success's steps to the task's
size. Honest worked solutions, of every chain length, operation and notation, still score 1."""

from __future__ import annotations

import pytest

from hacfed.clients.rollout_and_eval import rollout_plan
from hacfed.clients.textfilter import inbound
from hacfed.messages import Submission
from hacfed.response_format import response_format
from hacfed.rollout.hf import Completion
from hacfed.server.coordinator import Coordinator, ErrorCode, Journal
from hacfed.tasks.chain import ChainTask, make_problem
from hacfed.trajectory import Trajectory
from tests.unit.test_coordinator_fakes import FakeClock, make_config

TASK = ChainTask(terms=3, num_train=16, num_validation=4, num_eval=4)
TASK_TABLE = {"kind": "chain", "terms": 3, "num_train": 16, "num_validation": 4, "num_eval": 4}
ISSUE_EXAMPLE = "2+2=5\n7+7=99\nAnswer: 93"  # the issue's: true final answer, false steps
PROBLEM_93 = make_problem("add", (40, 28, 25))  # 40+28=68, 68+25=93


@pytest.mark.parametrize("response", [
    ISSUE_EXAMPLE,
    "40+28=69\n69+25=93\nAnswer: 93",  # one false step on the way to the right answer
    "40+28=68\n68+25=93\n1+1=3\nAnswer: 93",  # a false step after true ones
    "40 + 28 = 67\n68+25=93\nAnswer: 93",  # spaces do not hide it
    "40+28+25=94\nAnswer: 93",  # a run of terms is read whole
    "40+28=68=69\nAnswer: 93",  # a chained result
    "so 7=8 here\nAnswer: 93",  # an equality inside prose
])
def test_a_false_step_success_earns_reward_zero(response: str) -> None:
    verdict = TASK.verify(PROBLEM_93, response)
    assert verdict.reward == 0.0 and verdict.reason.startswith("false step"), verdict


@pytest.mark.parametrize("response", [
    "123456789012+1=123456789013\nAnswer: 93",  # a true step carrying a long number: a covert channel
    "600+0=600\nAnswer: 93",  # just past the task's largest number (3 terms: 297 or a 299 start)
    "90-100=-10\nAnswer: 93",  # below 0
    "-5+3=-2\nAnswer: 93",
])
def test_step_numbers_stay_within_the_tasks_range(response: str) -> None:
    verdict = TASK.verify(PROBLEM_93, response)
    assert verdict.reward == 0.0 and "outside the task's range" in verdict.reason, verdict


def test_the_format_holds_a_success_to_the_tasks_steps_and_number_sizes() -> None:
    fmt = response_format(TASK)
    assert fmt.fits(PROBLEM_93.solution, 1.0)
    assert not fmt.fits("40+28=68\n1000+1=1001\nAnswer: 93", 1.0)  # a 4-digit number: over max_value's 3
    assert not fmt.fits("40+28=68\n68+25=93\n1+1=2\nAnswer: 93", 1.0)  # a third step of a 3-term chain
    assert not fmt.fits("4\uff10+28=68\n68+25=93\nAnswer: 93", 1.0)  # a fullwidth digit


@pytest.mark.parametrize("terms", [2, 3, 6])
def test_every_reference_solution_still_scores_one_and_fits(terms: int) -> None:
    task = ChainTask(terms=terms, num_train=300, num_validation=100, num_eval=100, notations=("sym", "word"))
    fmt = response_format(task)
    for problem in [*task.train_problems(), *task.validation_problems(), *task.eval_problems()]:
        assert task.verify(problem, problem.solution).reward == 1.0, problem.prompt_id
        assert fmt.fits(problem.solution, 1.0), problem.prompt_id
    assert task.max_value == max(99 * terms, 299)


def test_true_steps_off_the_problems_own_chain_still_score() -> None:
    # the verifier checks truth and range, not the order a model chose
    assert TASK.verify(PROBLEM_93, "28+25=53\n40+53=93\nAnswer: 93").reward == 1.0
    assert TASK.verify(PROBLEM_93, "40+28=60+8\n68+25=93\nAnswer: 93").reward == 1.0  # both sides are sums


def test_the_task_says_what_its_verifier_does_not_check() -> None:
    assert "between the worked steps" in TASK.verifier_ignores


class _Engine:
    """A vLLM-shaped engine (`rollout_plan`'s `vllm`) that writes `text` for every sample."""

    def __init__(self, text: str) -> None:
        self.text = text

    def generate(self, model, tokenizer, prompts, *, num_samples, **_kwargs):
        return [[Completion(self.text, (1,) * 4, (-0.5,) * 4, "stop")] * num_samples for _ in prompts]


def _coordinator(tmp_path, **overrides) -> Coordinator:
    cfg = make_config(tmp_path, task=TASK_TABLE, group_size=2, prompts_per_round=1,
                      sampling={"max_new_tokens": 64}, **overrides)
    coord = Coordinator(cfg, TASK, Journal(cfg.journal_path), clock=FakeClock())
    coord.register("lab-a")
    return coord


def _false_step_group(plan, claim: float) -> tuple[Trajectory, ...]:
    """A group of the issue's text, rewritten to end in the plan's prompt's right answer."""
    planned = plan.prompts[0]
    text = ISSUE_EXAMPLE.replace("93", TASK.problem(planned.prompt_id).answer)
    return tuple(Trajectory(f"lab-a/{plan.round_id}/{planned.prompt_id}/{k}", planned.prompt_id, "lab-a", 0,
                            planned.messages, text, claim, -10.0, 20, "stop") for k in range(plan.group_size))


def test_at_the_lab_a_false_step_success_is_claimed_as_reward_zero(tmp_path) -> None:
    plan = _coordinator(tmp_path).open_round(0)
    problem = TASK.problem(plan.prompts[0].prompt_id)
    engine = _Engine(f"2+2=5\n7+7=99\nAnswer: {problem.answer}")  # only the steps are wrong
    samples = rollout_plan(None, None, TASK, plan, participant_id="lab-a", policy_version=0, base_seed=0,
                           batch_size=1, vllm=engine)
    assert [t.reward for t in samples] == [0.0] * plan.group_size
    assert all(inbound(TASK).why_not(t) is None for t in samples)  # a failure: no reason to drop it


def test_at_the_coordinator_a_false_step_success_is_verified_zero_and_a_claim_of_one_is_a_strike(tmp_path) -> None:
    coord = _coordinator(tmp_path)
    plan = coord.open_round(0)
    claimed = coord.submit(Submission(plan.run_id, "lab-a", 0, _false_step_group(plan, 1.0)), sender="lab-a")
    assert {r.code for r in claimed.rejected} == {ErrorCode.REWARD_MISMATCH}
    assert not claimed.accepted_ids
    assert [p.strikes for p in coord.participants() if p.participant_id == "lab-a"] == [plan.group_size]
    # the same text claimed honestly (0) is accepted, as a failure
    honest = _coordinator(tmp_path / "honest", answer_keys="public")
    plan = honest.open_round(0)
    group = _false_step_group(plan, 0.0)
    result = honest.submit(Submission(plan.run_id, "lab-a", 0, group), sender="lab-a")
    assert result.accepted_ids == tuple(t.trajectory_id for t in group) and not result.rejected


def test_arithmetic_says_what_its_verifier_does_not_check() -> None:
    from hacfed.tasks.arithmetic import ArithmeticTask

    assert ArithmeticTask().verifier_ignores.startswith("nothing")
    words = ArithmeticTask(style="words")
    assert "before the last integer" in words.verifier_ignores
    assert words.verify(words.train_problems()[0], f"1 + 1 = 3, so {words.train_problems()[0].answer}").reward == 1.0
