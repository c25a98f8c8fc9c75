"""What reaches a learner's update: only whole groups of G samples for the plan's own prompts, asked
with the plan's messages.

`hacpo_update`'s group baseline (docs/hacpo.md §3) and its per-prompt std assume that every group
it scores holds a source's G answers to the one prompt the plan gave everybody. The coordinator's
checks make that true; this test watches them from the learner's side, through the pool of the
`RoundUpdate` the learner trains on.
"""

from __future__ import annotations

import dataclasses

from hacfed.server.coordinator import ErrorCode
from hacfed.trajectory import ChatMessage
from tests.unit.test_coordinator_fakes import (
    TASK,
    FakeClock,
    make_coordinator,
    scripted_submission,
    scripted_trajectories,
)

G = 3


def test_a_peers_short_group_unplanned_prompt_and_altered_messages_never_reach_the_pool(tmp_path):
    coord = make_coordinator(tmp_path, FakeClock(), prompts_per_round=3, group_size=G)
    coord.register("a")
    coord.register("b")
    coord.open_round(0)
    plan = coord.plan_for(0)
    p0, p1, p2 = plan.prompt_ids
    coord.submit(scripted_submission(plan, "a"))
    honest = scripted_trajectories(plan, "b")  # G per prompt, in plan order
    short = honest[: G - 1]  # prompt 0: G − 1 samples
    altered = [honest[G], dataclasses.replace(honest[G + 1], prompt=(ChatMessage("user", "ignore the task"),)),
               honest[G + 2]]  # prompt 1: one sample asked with other messages
    other = next(p for p in TASK.train_problems() if p.prompt_id not in plan.prompt_ids)
    unplanned = dataclasses.replace(honest[2 * G], trajectory_id="u", prompt_id=other.prompt_id, prompt=other.messages)
    result = coord.submit(scripted_submission(plan, "b", trajectories=short + altered + honest[2 * G:] + [unplanned]))
    assert result.recorded and {r.code for r in result.rejected} == {
        ErrorCode.INCOMPLETE_GROUP, ErrorCode.PROMPT_MISMATCH, ErrorCode.GROUP_REJECTED, ErrorCode.UNASSIGNED_PROMPT}
    coord.close_round("quorum")
    coord.open_round(1)
    pool = coord.engine.round_update(1).pool
    # a's three groups, and of b's only prompt 2's whole, planned, unaltered group
    groups = {}
    for t in pool:
        groups.setdefault((t.source_id, t.prompt_id), []).append(t)
    assert sorted(groups) == sorted([("a", p0), ("a", p1), ("a", p2), ("b", p2)])
    assert all(len(ts) == G for ts in groups.values())
    planned = {p.prompt_id: p.messages for p in plan.prompts}
    assert all(tuple(t.prompt) == planned[t.prompt_id] for t in pool)
