"""Answer keys stay with the coordinator (`answer_keys = "coordinator"`, docs/design.md "Answer keys"):
labs receive questions only and claim no reward, the coordinator scores every sample alone, and each
lab's verified rewards come back with the pool. A copy-gold lab then gains neither P̂ nor reach; with
public answer keys it gains both. Driven through the real coordinator (`run_rounds`)."""

from __future__ import annotations

import dataclasses
import random

import pytest

from hacfed import wire
from hacfed.clients.participant import Participant, ParticipantConfig
from hacfed.clients.relay import ParticipantRejection
from hacfed.messages import RoundPlan, RoundUpdate, StepReport, Submission
from hacfed.models.zoo import build_untrained
from hacfed.proto import hacfed_v1_pb2 as pb  # only to craft a plan without the setting
from hacfed.server.coordinator import Coordinator, Journal
from hacfed.server.coordinator.journal import JournalError
from hacfed.server.coordinator.plan import make_plan, plan_from_json, plan_to_json
from hacfed.server.coordinator.transport import run_rounds
from hacfed.tasks.arithmetic import ArithmeticTask
from hacfed.tasks.chain import ChainTask
from hacfed.tools.hostile import HostileSpec, ScriptedLab, wrong_answer
from hacfed.trajectory import Trajectory
from hacfed.wire import ErrorCode, WireError
from tests.unit.test_client_service import setup  # noqa: F401  (a fixture: a coordinator and a lab's service)
from tests.unit.test_coordinator_fakes import FakeClock, make_config

TASK = ArithmeticTask(digits=2, num_train=200, num_eval=20)
COPIER = "hostile-copy-gold"
HONEST = ("lab-a", "lab-b", "lab-c", "lab-d")
K = 2  # peers per prompt: fewer than the other labs, so the choice decides who reaches whom


class _Solver:
    """An honest lab without a model: one right answer per group (its first sample), the rest wrong.
    It claims its verifier's rewards when the answers are public, nothing (0.0) when they are not.
    Records every update it got."""

    def __init__(self, participant_id: str) -> None:
        self.participant_id = participant_id
        self.updates: list[RoundUpdate] = []
        self.claims: list[float] = []

    def exchange(self, update: RoundUpdate) -> Submission | None:
        self.updates.append(update)
        plan = update.next_plan
        if plan is None:
            return Submission(update.run_id, self.participant_id, update.pool_round + 1, (),
                              StepReport(self.participant_id, update.pool_round + 1, {"loss": 0.1}, 0.5))
        out = []
        rng = random.Random(0)
        for planned in plan.prompts:
            problem = TASK.problem(planned.prompt_id)
            for k in range(plan.group_size):
                text = problem.solution if k == 0 else wrong_answer(TASK, problem, rng)
                reward = TASK.verify(problem, text).reward if plan.answer_keys == "public" else 0.0
                out.append(Trajectory(f"{self.participant_id}/{plan.round_id}/{planned.prompt_id}/{k}",
                                      planned.prompt_id, self.participant_id, 0, planned.messages, text, reward,
                                      -0.5 * len(text), len(text), "stop"))
        self.claims.extend(t.reward for t in out)
        return Submission(update.run_id, self.participant_id, plan.round_id, tuple(out), nonce=f"{plan.round_id:032x}")


class _Copier:
    """`hacfed sim`'s hostile:copy-gold lab as run_rounds sees it."""

    def __init__(self) -> None:
        self.participant_id = COPIER
        self.lab = ScriptedLab(COPIER, HostileSpec("copy-gold"), TASK, seed=0)

    def exchange(self, update: RoundUpdate) -> Submission | None:
        return self.lab.step(update)


def _federation(tmp_path, answer_keys: str, rounds: int = 3):
    cfg = make_config(tmp_path, rounds=rounds, prompts_per_round=3, group_size=4, expected_participants=5,
                      min_participants=5, pool_peers_per_prompt=K, pool_peer_choice="successes",
                      answer_keys=answer_keys)
    coord = Coordinator(cfg, TASK, Journal(cfg.journal_path), clock=FakeClock())
    honest = [_Solver(pid) for pid in HONEST]
    outcomes = run_rounds(coord, [*honest, _Copier()], sleep=coord.now)
    return coord, honest, outcomes


def _reach(honest: list[_Solver]) -> float:
    """The fraction of (honest learner, pooled prompt) pairs whose pool carried the copier's group."""
    sent = total = 0
    for lab in honest:
        for update in lab.updates:
            prompts = {t.prompt_id for t in update.pool}
            total += len(prompts)
            sent += len({t.prompt_id for t in update.pool if t.source_id == COPIER})
    assert total > 0
    return sent / total


def test_copy_gold_gains_full_capability_and_reach_with_public_answer_keys(tmp_path):
    coord, honest, outcomes = _federation(tmp_path, "public")
    assert coord.capabilities()[COPIER] == 1.0  # every sample a verified success
    assert all(coord.capabilities()[pid] == pytest.approx(0.25) for pid in HONEST)  # one of G = 4
    assert _reach(honest) == 1.0  # the most verified reward on every prompt: sent to every learner
    assert all(not o.results[COPIER].rejected for o in outcomes)


def test_copy_gold_gains_neither_capability_nor_reach_when_answer_keys_stay_with_the_coordinator(tmp_path):
    coord, honest, outcomes = _federation(tmp_path, "coordinator")
    assert coord.capabilities()[COPIER] < 1e-6  # P̂ at its floor: no verified success
    assert all(coord.capabilities()[pid] == pytest.approx(0.25) for pid in HONEST)  # honest work still counts
    assert _reach(honest) == 0.0  # no learner is sent its samples
    assert all(not o.results[COPIER].rejected for o in outcomes)  # accepted, scored 0: nothing to copy


def test_own_rewards_come_back_verified_although_nothing_was_claimed(tmp_path):
    coord, honest, outcomes = _federation(tmp_path, "coordinator", rounds=2)
    lab = honest[0]
    assert lab.claims and set(lab.claims) == {0.0}
    assert all(not o.results[lab.participant_id].rejected for o in outcomes)  # no claims, no strikes
    own = [t for u in lab.updates for t in u.pool if t.source_id == lab.participant_id]
    assert len(own) == 2 * 3 * 4  # every own sample of both rounds came back
    for t in own:
        assert t.reward == TASK.verify(TASK.problem(t.prompt_id), t.response_text).reward
    assert sum(t.reward for t in own) == 2 * 3  # the right first sample of each group
    assert all(p.strikes == 0 for p in coord.participants())


def test_a_false_claim_is_a_strike_only_when_labs_hold_the_answers(tmp_path):
    for keys, mismatches in (("public", 2 * 2), ("coordinator", 0)):  # the wrong samples: 2 prompts x (G - 1)
        cfg = make_config(tmp_path / keys, answer_keys=keys)
        coord = Coordinator(cfg, TASK, Journal(cfg.journal_path), clock=FakeClock())
        coord.register("lab")
        plan = coord.open_round(0)
        lab = _Solver("lab")
        sub = lab.exchange(RoundUpdate(plan.run_id, None, (), {}, plan))
        lied = tuple(dataclasses.replace(t, reward=1.0) for t in sub.trajectories)
        result = coord.submit(dataclasses.replace(sub, trajectories=lied), sender="lab")
        assert sum(r.code == "HACFED-E-REWARD-MISMATCH" for r in result.rejected) == mismatches
        assert len(result.accepted_ids) == (0 if mismatches else len(lied))


def _chain_plan(tmp_path, keys: str) -> tuple[ChainTask, RoundPlan]:
    task = ChainTask(terms=3, num_train=50, num_eval=10)
    cfg = make_config(tmp_path / keys, task={"kind": "chain", "terms": 3, "num_train": 50, "num_eval": 10},
                      answer_keys=keys)
    return task, make_plan(cfg, task, 0)


def test_the_plan_says_who_holds_the_keys_and_carries_no_answer(tmp_path):
    task, plan = _chain_plan(tmp_path, "coordinator")
    assert plan.answer_keys == "coordinator"
    data = wire.encode_round_update(RoundUpdate(plan.run_id, None, (), {}, plan, (), plan.hacpo))
    text = data.decode("utf-8", errors="replace")
    for planned in plan.prompts:
        assert planned.messages[-1].content in text  # the question travels ...
        assert task.problem(planned.prompt_id).solution not in text  # ... its worked answer never does
    assert wire.decode_round_update(data).next_plan == plan
    assert plan_from_json(plan_to_json(plan)) == plan
    frame = pb.WireMessage.FromString(wire.encode_round_plan(plan))
    frame.round_plan.ClearField("answer_keys")  # a plan must say it: never defaulted
    with pytest.raises(WireError, match="answer_keys") as info:
        wire.decode_round_plan(frame.SerializeToString())
    assert info.value.code == ErrorCode.SCHEMA


def test_the_setting_is_checked_and_binds_the_journal(tmp_path):
    with pytest.raises(ValueError, match=r"answer_keys must be one of 'public', 'coordinator', got 'lab'"):
        make_config(tmp_path, answer_keys="lab")
    public = make_config(tmp_path)
    assert public.answer_keys == "public" and "answer_keys" not in public.plan_fingerprint()
    Coordinator(public, TASK, Journal(public.journal_path), clock=FakeClock())
    with pytest.raises(JournalError, match="answer_keys"):
        coordinator = make_config(tmp_path, answer_keys="coordinator")
        Coordinator(coordinator, TASK, Journal(coordinator.journal_path), clock=FakeClock())


def test_copy_gold_without_the_key_writes_no_answer_and_claims_nothing(tmp_path):
    _, plan = _chain_plan(tmp_path, "coordinator")
    task = ChainTask(terms=3, num_train=50, num_eval=10)
    lab = ScriptedLab(COPIER, HostileSpec("copy-gold"), task, seed=0)
    sub = lab.step(RoundUpdate(plan.run_id, None, (), {}, plan))
    assert {(t.response_text, t.reward) for t in sub.trajectories} == {("", 0.0)}
    assert sub.report.metrics == {}
    public = lab.step(RoundUpdate(plan.run_id, None, (), {}, dataclasses.replace(plan, answer_keys="public")))
    assert all(t.reward == 1.0 and t.response_text for t in public.trajectories)


def test_a_lab_without_the_problems_rolls_out_claims_nothing_and_trains(tmp_path):
    """A real participant whose local task does not hold the plan's prompts (chain prompts, an
    arithmetic task): it samples them, claims 0.0, trains on its verified samples and reports them."""
    _, plan = _chain_plan(tmp_path, "coordinator")
    plan = dataclasses.replace(plan, sampling=dataclasses.replace(plan.sampling, max_new_tokens=6))
    model, tok = build_untrained("tiny-llama", seed=1)
    lab = Participant(ParticipantConfig("a", "tiny-llama", eval_problems=4, learning_rate=1e-3), model, tok, TASK)
    first = lab.step(RoundUpdate(plan.run_id, None, (), {"a": 1.0}, plan, ("a",), plan.hacpo))
    assert first.trajectories and {t.reward for t in first.trajectories} == {0.0}
    assert "reward_mean" not in first.report.metrics  # no local rewards to report
    # The coordinator's verdicts: the first sample of each group right, the rest wrong.
    verified = tuple(dataclasses.replace(t, reward=1.0 if t.trajectory_id.endswith("/0") else 0.0)
                     for t in first.trajectories)
    before = [p.detach().clone() for p in lab.model.parameters()]
    final = lab.step(RoundUpdate(plan.run_id, 0, verified, {"a": 0.25}, None, ("a",), plan.hacpo))
    assert final.report.metrics["num_updates"] > 0
    assert any((a != b).any() for a, b in zip(before, lab.model.parameters()))
    assert final.report.metrics["own_verified_reward_mean"] == pytest.approx(1 / plan.group_size)


def test_a_lab_holds_the_plans_prompts_only_when_the_answers_are_public(setup) -> None:  # noqa: F811
    """hacfed-client's service checks a public plan against its local task; a plan whose answer keys
    stay with the coordinator needs no local problems: the local task is what the lab evaluates on."""
    coordinator, service, sealed, participant, _ = setup
    other_task = ArithmeticTask(digits=3, num_train=200, num_eval=20)  # none of the plan's add2 prompts
    update = coordinator.engine.round_update(0)
    with pytest.raises(ParticipantRejection, match="task mismatch"):
        service(task=other_task).handle(sealed(update))
    keyless = dataclasses.replace(update, next_plan=dataclasses.replace(update.next_plan, answer_keys="coordinator"))
    service(task=other_task).handle(sealed(keyless))
    assert len(participant.updates) == 1


def test_the_lab_console_says_no_claims_and_shows_the_verified_reward_one_round_late(tmp_path) -> None:
    from hacfed.clients.runner import describe_answer
    from hacfed.clients.service import Answered

    _, plan = _chain_plan(tmp_path, "coordinator")
    own = Trajectory("a/0/p/0", plan.prompts[0].prompt_id, "a", 0, plan.prompts[0].messages, "x", 1.0, -1.0, 1, "stop")
    update = RoundUpdate(plan.run_id, 0, (own,), {"a": 1.0}, plan)
    sub = Submission(plan.run_id, "a", 1, (dataclasses.replace(own, reward=0.0),),
                     StepReport("a", 1, {"own_verified_reward_mean": 1.0}, None))
    line = describe_answer(Answered(update, sub, 1.0, False), "a")
    assert "verified reward of round 0 1.00" in line and "no claims (the coordinator holds the answers)" in line
    assert "claimed reward" not in line


def test_hacfed_sim_hands_the_setting_to_its_coordinator(tmp_path) -> None:
    from hacfed.tasks.registry import load_task
    from hacfed.tools.sim import SimConfig, _coordinator_config

    cfg = SimConfig(agents=("tiny-llama", "hostile:copy-gold"), answer_keys="coordinator", state_dir=str(tmp_path))
    assert _coordinator_config(cfg, load_task(cfg.task), ["tiny-llama", COPIER]).answer_keys == "coordinator"
    assert SimConfig().answer_keys == "public"  # development: labs hold the answers
    with pytest.raises(ValueError, match="answer_keys must be one of public, coordinator, got 'lab'"):
        SimConfig(answer_keys="lab")
