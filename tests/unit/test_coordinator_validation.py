"""Pure submission checks: every reason code, whole-group rejection, verified rewards, and the
rule that the verifier never runs on a group the cheap checks already refused."""

from __future__ import annotations

import dataclasses

import pytest

from hacfed.messages import StepReport, Submission
from hacfed.server.coordinator import ErrorCode, ValidationLimits, make_plan, submission_digest, validate_submission
from hacfed.server.coordinator.errors import GRPC_STATUS, safe_text
from hacfed.server.coordinator.validation import quick_size_rejection
from hacfed.trajectory import ChatMessage
from tests.unit.test_coordinator_fakes import TASK, make_config, replace_at, scripted_submission, scripted_trajectories

G = 3


class CountingTask:
    """TASK with a count of verifier calls."""

    name = TASK.name

    def __init__(self):
        self.verified: list[str] = []

    def train_problems(self):
        return TASK.train_problems()

    def eval_problems(self):
        return TASK.eval_problems()

    def problem(self, prompt_id):
        return TASK.problem(prompt_id)

    def verify(self, problem, response):
        self.verified.append(problem.prompt_id)
        return TASK.verify(problem, response)


@pytest.fixture
def plan(tmp_path):
    return make_plan(make_config(tmp_path, group_size=G, prompts_per_round=2), TASK, 0)


LIMITS = ValidationLimits(group_size=G, max_new_tokens=8, max_response_chars=100, min_mean_logp=-50.0)


def judge(plan, trajectories, task=None, limits=LIMITS, used=frozenset(), report=None):
    sub = Submission(plan.run_id, "a", plan.round_id, tuple(trajectories), report)
    return validate_submission(sub, plan, task or TASK, limits, used)


def codes(outcome):
    return {(r.trajectory_id, r.code) for r in outcome.rejections}


def test_honest_submission_is_accepted_with_verified_rewards(plan):
    trajectories = scripted_trajectories(plan, "a")
    outcome = judge(plan, trajectories)
    assert outcome.rejections == () and outcome.strikes == ()
    assert [a.trajectory.trajectory_id for a in outcome.accepted] == [t.trajectory_id for t in trajectories]
    assert [a.trajectory.reward for a in outcome.accepted] == [1.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    assert [(a.prompt_pos, a.idx) for a in outcome.accepted] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]


def test_falsified_reward_rejects_the_group_and_is_a_strike(plan):
    trajectories = scripted_trajectories(plan, "a", falsify=1)  # sample 1 of prompt 0 claims 1.0
    outcome = judge(plan, trajectories)
    liar, sibling0, sibling2 = (trajectories[i].trajectory_id for i in (1, 0, 2))
    assert codes(outcome) == {
        (liar, ErrorCode.REWARD_MISMATCH), (sibling0, ErrorCode.GROUP_REJECTED), (sibling2, ErrorCode.GROUP_REJECTED),
    }
    assert [s.trajectory_id for s in outcome.strikes] == [liar]
    # the other prompt's honest group is accepted
    assert {a.trajectory.prompt_id for a in outcome.accepted} == {plan.prompt_ids[1]}


def test_accepted_reward_is_the_verifiers_not_the_claim(plan):
    trajectories = scripted_trajectories(plan, "a")
    # a claim within float noise of the truth is not a mismatch, but the stored reward is exact
    trajectories = replace_at(trajectories, 0, reward=1.0 - 1e-9)
    outcome = judge(plan, trajectories)
    assert outcome.accepted[0].trajectory.reward == 1.0 and outcome.accepted[0].claimed_reward == 1.0 - 1e-9


@pytest.mark.parametrize(
    "index, changes, code",
    [
        (1, dict(response_text="9" * 101), ErrorCode.SIZE),
        (1, dict(response_text="\ud800"), ErrorCode.SCHEMA),
        (1, dict(source_id="b"), ErrorCode.SOURCE_MISMATCH),
        (1, dict(source_logp_sum=-120.0, source_token_count=2), ErrorCode.LOGPROB_RANGE),  # mean -60 < -50
        (1, dict(source_token_count=9, source_logp_sum=-1.0), ErrorCode.LOGPROB_RANGE),  # > max_new_tokens
        (1, dict(prompt=(ChatMessage("user", "ignore the task"),)), ErrorCode.PROMPT_MISMATCH),
        (1, dict(trajectory_id="x" * 200), ErrorCode.SCHEMA),
        (1, dict(trajectory_id="forged\nlog line"), ErrorCode.SCHEMA),
        # an empty text that did not stop gives a learner nothing to train on
        (1, dict(response_text="", finish_reason="length", source_token_count=3, source_logp_sum=-1.0),
         ErrorCode.SCHEMA),
    ],
)
def test_cheap_check_failures_reject_the_whole_group_without_verifying(plan, index, changes, code):
    task = CountingTask()
    trajectories = replace_at(scripted_trajectories(plan, "a"), index, **changes)
    outcome = judge(plan, trajectories, task=task)
    rejected = {r.code for r in outcome.rejections}
    assert rejected == {code, ErrorCode.GROUP_REJECTED}
    assert len(outcome.rejections) == G  # the whole group of prompt 0
    assert {a.trajectory.prompt_id for a in outcome.accepted} == {plan.prompt_ids[1]}
    assert task.verified == [plan.prompt_ids[1]] * G  # the refused group never reached the verifier
    assert outcome.strikes == ()


def test_forged_log_probs_that_bypass_the_dataclass_are_caught(plan):
    trajectories = scripted_trajectories(plan, "a")
    for value in (float("nan"), float("inf"), 0.5):
        forged = trajectories[0]
        object.__setattr__(forged := dataclasses.replace(forged), "source_logp_sum", value)
        outcome = judge(plan, [forged] + trajectories[1:])
        assert (forged.trajectory_id, ErrorCode.LOGPROB_RANGE) in codes(outcome), value


def test_policy_version_must_not_go_back(plan):
    trajectories = scripted_trajectories(plan, "a", version=2)
    limits = dataclasses.replace(LIMITS, min_policy_version=3)
    outcome = judge(plan, trajectories, limits=limits)
    assert not outcome.accepted and ErrorCode.POLICY_VERSION in {r.code for r in outcome.rejections}


def test_group_size_must_be_exactly_g(plan):
    trajectories = scripted_trajectories(plan, "a")
    short = trajectories[:2] + trajectories[3:]  # prompt 0 has 2 of 3
    outcome = judge(plan, short)
    assert codes(outcome) == {(t.trajectory_id, ErrorCode.INCOMPLETE_GROUP) for t in trajectories[:2]}
    extra = dataclasses.replace(trajectories[0], trajectory_id="extra")
    outcome = judge(plan, trajectories + [extra])
    assert {r.code for r in outcome.rejections} == {ErrorCode.INCOMPLETE_GROUP} and len(outcome.rejections) == G + 1


def test_missing_prompt_is_reported_without_an_id(plan):
    trajectories = scripted_trajectories(plan, "a")[:G]
    outcome = judge(plan, trajectories)
    assert len(outcome.accepted) == G
    assert [(r.trajectory_id, r.code) for r in outcome.rejections] == [(None, ErrorCode.INCOMPLETE_GROUP)]
    assert plan.prompt_ids[1] in outcome.rejections[0].detail


def test_unassigned_and_unknown_prompts(plan):
    trajectories = scripted_trajectories(plan, "a")
    other = next(p for p in TASK.train_problems() if p.prompt_id not in plan.prompt_ids)
    unassigned = dataclasses.replace(
        trajectories[0], trajectory_id="u", prompt_id=other.prompt_id, prompt=other.messages
    )
    unknown = dataclasses.replace(trajectories[0], trajectory_id="k", prompt_id="add2:1000+1")
    outcome = judge(plan, trajectories + [unassigned, unknown])
    assert len(outcome.accepted) == 2 * G  # the planned groups are unaffected
    assert codes(outcome) == {("u", ErrorCode.UNASSIGNED_PROMPT), ("k", ErrorCode.UNKNOWN_PROMPT)}


def test_duplicate_ids_within_and_across_submissions(plan):
    trajectories = scripted_trajectories(plan, "a")
    dup = replace_at(trajectories, 1, trajectory_id=trajectories[0].trajectory_id)
    outcome = judge(plan, dup)
    assert (trajectories[0].trajectory_id, ErrorCode.DUPLICATE) in codes(outcome)
    outcome = judge(plan, trajectories, used={trajectories[4].trajectory_id})
    assert (trajectories[4].trajectory_id, ErrorCode.DUPLICATE) in codes(outcome)
    assert len(outcome.accepted) == G


def test_report_checks(plan):
    trajectories = scripted_trajectories(plan, "a")
    ok = judge(plan, trajectories, report=StepReport("a", 0, {"loss": 1.0}, 0.5))
    assert ok.report_rejection is None
    bad = [
        (StepReport("b", 0, {}), ErrorCode.SOURCE_MISMATCH),
        (StepReport("a", 5, {}), ErrorCode.SCHEMA),
        (StepReport("a", 0, {"loss": float("nan")}), ErrorCode.SCHEMA),
    ]
    for report, code in bad:
        outcome = judge(plan, trajectories, report=report)
        assert outcome.report_rejection.code == code
        assert len(outcome.accepted) == 2 * G  # a bad report does not cost the trajectories


def test_quick_size_and_digest(plan):
    sub = scripted_submission(plan, "a")
    assert quick_size_rejection(sub, max_trajectories=2 * G, max_bytes=10_000) is None
    assert quick_size_rejection(sub, max_trajectories=G, max_bytes=10_000).code == ErrorCode.SIZE
    assert quick_size_rejection(sub, max_trajectories=2 * G, max_bytes=5).code == ErrorCode.SIZE
    size, digest = submission_digest(sub)
    assert size > 0 and len(digest) == 64
    assert submission_digest(scripted_submission(plan, "a")) == (size, digest)  # same content, same digest
    changed = scripted_submission(plan, "a", trajectories=replace_at(list(sub.trajectories), 0, source_logp_sum=-1.5))
    assert submission_digest(changed)[1] != digest
    nonce = scripted_submission(plan, "a", nonce="ab" * 16)
    assert submission_digest(nonce)[1] != digest


def test_every_code_maps_to_a_specific_grpc_status_and_text_is_safe():
    assert set(GRPC_STATUS) == set(ErrorCode)
    assert not {"UNKNOWN", "INTERNAL"} & set(GRPC_STATUS.values())
    assert all(code.value.startswith("HACFED-E-") for code in ErrorCode)
    text = safe_text("a\ud800\u202e" + "x" * 500)
    text.encode("utf-8")  # storable
    assert len(text) <= 203 and "\u202e" not in text
