"""Issue 9's submission attacks, reproduced against the coordinator: each test is the attack as the
review ran it, and now fails to reproduce.

- trajectory-id squatting (issue 9, item 3): test_squatted_trajectory_ids_do_not_block_the_owner
- capability inflation by omission (item 4): test_omitting_wrong_prompts_does_not_inflate_capability,
  and the same attack with spoiled groups: test_spoiling_wrong_groups_does_not_inflate_capability
- flooding (security.md S5/T8): test_flooding_lab_is_refused_while_another_lab_in_the_same_round_succeeds
"""

from __future__ import annotations

import dataclasses
import secrets

import pytest

from hacfed.messages import RoundPlan, StepReport, Submission
from hacfed.server.coordinator import ErrorCode
from hacfed.trajectory import Trajectory
from tests.unit.test_coordinator_fakes import TASK, FakeClock, make_coordinator, scripted_trajectories, wrong_answer
from tests.unit.test_coordinator_validation import CountingTask


def _samples(plan: RoundPlan, pid: str, right: set[int], id_owner: str | None = None) -> list[Trajectory]:
    """G samples per planned prompt: all right for prompt positions in `right`, all wrong otherwise.
    Ids follow the client's predictable pattern run/r<round>/<participant>/<prompt>/<k>; `id_owner`
    writes them in another participant's name (the squatter)."""
    out = []
    for pos, prompt in enumerate(plan.prompts):
        problem = TASK.problem(prompt.prompt_id)
        for k in range(plan.group_size):
            text = problem.answer if pos in right else wrong_answer(problem.answer)
            out.append(Trajectory(
                trajectory_id=f"{plan.run_id}/r{plan.round_id}/{id_owner or pid}/{prompt.prompt_id}/{k}",
                prompt_id=prompt.prompt_id, source_id=pid, policy_version=0, prompt=prompt.messages,
                response_text=text, reward=TASK.verify(problem, text).reward, source_logp_sum=-0.5 * len(text),
                source_token_count=len(text), finish_reason="stop",
            ))
    return out


def _submit(coord, plan, pid, trajectories):
    sub = Submission(plan.run_id, pid, plan.round_id, tuple(trajectories), StepReport(pid, plan.round_id, {}),
                     nonce=secrets.token_hex(16))
    return coord.submit(sub, sender=pid)


def test_squatted_trajectory_ids_do_not_block_the_owner(tmp_path):
    coord = make_coordinator(tmp_path)
    coord.register("lab-a")
    coord.register("lab-b")
    plan = coord.open_round(0)
    # lab-b submits its own valid samples first, under the ids lab-a's client will use
    squat = _submit(coord, plan, "lab-b", _samples(plan, "lab-b", {0}, id_owner="lab-a"))
    assert squat.rejected == () and len(squat.accepted_ids) == 6  # its samples are fine: they are accepted ...
    honest = _submit(coord, plan, "lab-a", _samples(plan, "lab-a", {0}))
    # ... and lab-a's honest submission is accepted whole: ids live in their source's namespace
    assert honest.rejected == () and sorted(honest.accepted_ids) == sorted(squat.accepted_ids)
    coord.close_round("quorum")
    coord.open_round(1)
    pool = coord.engine.round_update(1).pool
    assert sorted((t.source_id, t.trajectory_id) for t in pool) == sorted(
        [("lab-a", i) for i in honest.accepted_ids] + [("lab-b", i) for i in squat.accepted_ids])
    # an id stays unique within its own namespace: lab-a reusing one of its ids is still a duplicate
    used = honest.accepted_ids[0]
    assert coord.journal.used_trajectory_ids("lab-a", [used]) == {used}
    assert coord.journal.used_trajectory_ids("lab-c", [used]) == set()


@pytest.mark.parametrize("attack", ["omit", "spoil"])
def test_omitting_wrong_prompts_does_not_inflate_capability(tmp_path, attack):
    """3 prompts x G=2 per round; both labs get prompt 0 right and prompts 1, 2 wrong (P = 1/3).
    The cheater leaves out the groups it got wrong ("omit") or sends them with one invalid sample so
    they are rejected ("spoil"). Before the fix, 3 rounds of omission gave P̂ = 1.0 against 0.333."""
    clock = FakeClock()
    coord = make_coordinator(tmp_path, clock, rounds=3, prompts_per_round=3, group_size=2)
    coord.register("honest")
    coord.register("cheater")
    for r in range(3):
        plan = coord.open_round(r)
        assert _submit(coord, plan, "honest", _samples(plan, "honest", {0})).rejected == ()
        samples = _samples(plan, "cheater", {0})
        if attack == "omit":
            kept = samples[:2]  # prompt 0's group only
        else:  # one sample claiming more tokens than the plan allows gets each wrong group rejected
            kept = [dataclasses.replace(t, source_token_count=100, source_logp_sum=-50.0) if i in (2, 4) else t
                    for i, t in enumerate(samples)]
        result = _submit(coord, plan, "cheater", kept)
        assert len(result.accepted_ids) == 2  # its good group is still used for training
        capabilities = coord.close_round("quorum").capabilities
    assert capabilities["honest"] == pytest.approx(1 / 3)
    assert capabilities["cheater"] == pytest.approx(1 / 3)  # was 1.0 before the fix


def test_a_lab_whose_every_group_is_rejected_is_scored_zero_not_left_out(tmp_path):
    """Spoiling every group of a round (each one rejected, nothing accepted) is the omission attack
    again: the lab must still be scored 0 on all its assigned samples, not left out of P̂ for that
    round. Round 0 is honest (P̂ = 1/3 for both labs); in round 1 the cheater spoils all three groups,
    so its P̂ must fall to (2 + 0) / 12 = 1/6 instead of staying at 1/3."""
    clock = FakeClock()
    coord = make_coordinator(tmp_path, clock, rounds=2, prompts_per_round=3, group_size=2)
    coord.register("honest")
    coord.register("cheater")
    for r in range(2):
        plan = coord.open_round(r)
        assert _submit(coord, plan, "honest", _samples(plan, "honest", {0})).rejected == ()
        samples = _samples(plan, "cheater", {0})
        if r == 1:  # one sample over the plan's token count per group: every group is rejected
            samples = [dataclasses.replace(t, source_token_count=100, source_logp_sum=-50.0) if i % 2 else t
                       for i, t in enumerate(samples)]
        result = _submit(coord, plan, "cheater", samples)
        assert len(result.accepted_ids) == (0 if r else 6) and len(result.rejected) == (6 if r else 0), result
        capabilities = coord.close_round("quorum").capabilities
    assert capabilities["honest"] == pytest.approx(1 / 3)
    assert capabilities["cheater"] == pytest.approx(1 / 6)


def test_flooding_lab_is_refused_while_another_lab_in_the_same_round_succeeds(tmp_path):
    """S5: lab-a sends 40 submissions in one round, 10x its quota of 4 full submissions' worth of
    trajectories; each refusal has its own code and a retry-after hint, the verifier runs for one
    submission only, and lab-b's submission in the same round is accepted."""
    clock = FakeClock()
    task = CountingTask()
    coord = make_coordinator(tmp_path, clock, task=task, rate_limit_per_s=1.0, rate_limit_burst=8)
    coord.register("lab-a")
    coord.register("lab-b")
    plan = coord.open_round(0)
    results = []
    for i in range(40):
        trajectories = [dataclasses.replace(t, trajectory_id=f"{t.trajectory_id}#{i}")
                        for t in scripted_trajectories(plan, "lab-a")]
        results.append(_submit(coord, plan, "lab-a", trajectories))
        clock.t += 0.05  # 20 submissions per second, against a rate of 1/s with a burst of 8
    n_flood_verified = len(task.verified)
    honest = _submit(coord, plan, "lab-b", scripted_trajectories(plan, "lab-b"))
    codes = [r.refusal for r in results]
    assert results[0].recorded and codes[0] is None  # the first one is judged and recorded
    assert codes[1:8].count(ErrorCode.DUPLICATE) >= 3  # within the burst: cheap refusals, no verifying
    assert ErrorCode.RATE_LIMITED in codes and ErrorCode.QUOTA_TRAJECTORIES in codes
    limited = [r.rejected[0] for r in results if r.refusal in (ErrorCode.RATE_LIMITED, ErrorCode.QUOTA_TRAJECTORIES)]
    assert limited and all(x.retry_after_s is not None and x.retry_after_s > 0 for x in limited)
    assert n_flood_verified == len(plan.prompts) * plan.group_size  # the verifier ran for one submission only
    assert honest.rejected == () and honest.recorded  # the other lab is unaffected
    assert coord.journal.count("submissions") == 2
    # the flooder's bucket refills: after its retry-after, a (duplicate) attempt is judged again
    clock.t += max(x.retry_after_s for x in limited if x.code == ErrorCode.RATE_LIMITED)
    assert coord.limiter.take_token("lab-a") is None


def test_quota_refusals_are_journaled_and_quotas_reset_with_the_round(tmp_path):
    clock = FakeClock()
    coord = make_coordinator(tmp_path, clock, rate_limit_burst=100, round_quota_trajectories=6)
    coord.register("lab-a")
    plan = coord.open_round(0)
    first = _submit(coord, plan, "lab-a", scripted_trajectories(plan, "lab-a"))
    assert first.recorded
    second = _submit(coord, plan, "lab-a", scripted_trajectories(plan, "lab-a", tag="x"))
    assert second.refusal == ErrorCode.QUOTA_TRAJECTORIES and second.rejected[0].retry_after_s == pytest.approx(100.0)
    with coord.journal._lock:
        codes = [r[0] for r in coord.journal._db.execute("SELECT code FROM rejections WHERE submission_seq IS NULL")]
    assert codes == ["HACFED-E-QUOTA-TRAJECTORIES"]
    coord.close_round("quorum")
    plan1 = coord.open_round(1)
    assert _submit(coord, plan1, "lab-a", scripted_trajectories(plan1, "lab-a")).recorded  # a new round's quota


def test_a_new_round_refills_the_rate_limit_however_fast_rounds_go(tmp_path):
    """An in-process simulation closes rounds faster than the refill rate: each lab's one submission
    per round must never be throttled (it was, after ~30 fast rounds)."""
    clock = FakeClock()
    coord = make_coordinator(tmp_path, clock, rounds=40, rate_limit_per_s=0.5, rate_limit_burst=2)
    coord.register("lab-a")
    for r in range(40):
        plan = coord.open_round(r)
        assert _submit(coord, plan, "lab-a", _samples(plan, "lab-a", {0})).recorded, r
        coord.close_round("quorum")
        clock.t += 0.1  # 10 rounds per second
