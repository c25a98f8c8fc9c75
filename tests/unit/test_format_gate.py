"""Successes outside the task's response format earn nothing (`format_gate`, docs/security.md "Inbound
checks on peer text"): the pure rule, its setting, and a canary lab among two honest labs through the
real coordinator and its in-process round driver (`run_rounds`), K = 1 peer per prompt chosen by
`successes`, as the recommended three-lab configuration runs.

The canary lab solves every prompt with TEXT on its own line of each derivation: G verified successes
per group, which a lab's inbound filter leaves out (a chain success holds worked steps and `Answer: N`
only). Without the gate it has the most verified reward on every prompt, so each honest learner's one
peer slot goes to a group its filter then drops: no peer at all. With the gate its successes are
credited 0 and its groups rank last, so each honest learner is sent its honest peer (even one that
solved nothing), and the canary lab's P̂ is the floor."""

from __future__ import annotations

import random

import pytest

from hacfed.capability import SuccessMemory, credit_successes, response_key
from hacfed.clients.textfilter import filter_pool, inbound
from hacfed.messages import RoundUpdate, StepReport, Submission
from hacfed.response_format import response_format
from hacfed.server.coordinator import Coordinator, Journal
from hacfed.server.coordinator.success_credit import REFUSED_GROUP
from hacfed.server.coordinator.transport import run_rounds
from hacfed.tasks.chain import ChainTask
from hacfed.tools.hostile import HostileSpec, ScriptedLab
from hacfed.trajectory import Trajectory
from tests.unit.test_coordinator_fakes import FakeClock, make_config

TASK = ChainTask(terms=3, num_train=16, num_validation=1, num_eval=1)
TASK_TABLE = {"kind": "chain", "terms": 3, "num_train": 16, "num_validation": 1, "num_eval": 1}
CANARY = "hostile-canary"
HONEST = ("lab-a", "lab-b")
G, ROUNDS = 4, 4
TEXT = "see-evil.example"


# -- the pure rule -----------------------------------------------------------------------------------

FITS = response_format(TASK).fits
STEPS = "77+64=141\n141+85=226\nAnswer: 226"


def test_the_format_is_the_lab_filters_own() -> None:
    assert FITS(STEPS, 1.0)
    assert not FITS(f"77+64=141\n{TEXT}\n141+85=226\nAnswer: 226", 1.0)  # the canary's own line
    assert not FITS(f"{STEPS}\x1b[2J", 1.0)  # a control character
    assert FITS("I cannot tell.\nAnswer: 0", 0.0)  # a failure: its length alone
    assert not FITS("x" * 1000, 0.0)


def test_a_group_with_a_sample_outside_the_format_is_credited_zero() -> None:
    samples = [("c", "p", STEPS, 1.0), ("c", "p", f"{TEXT} {STEPS}", 1.0), ("c", "p", "Answer: 1", 0.0),
               ("c", "q", STEPS, 1.0), ("a", "p", STEPS, 1.0)]
    credits, added = credit_successes(samples, None, fits=FITS)
    assert credits == [0.0, 0.0, 0.0, 1.0, 1.0]  # c's group for p, whole; its group for q and a's as they are
    assert added == []  # no memory without dedup
    assert credit_successes(samples, None)[0] == [1.0, 1.0, 0.0, 1.0, 1.0]  # neither setting: the rewards


def test_with_dedup_a_success_outside_the_format_owns_no_key() -> None:
    fits = lambda text, reward: "evil" not in text  # noqa: E731 (a format that refuses one word)
    long = "a worked derivation long enough to be keyed, written down one careful step at a time: 42"
    memory = SuccessMemory(8)
    samples = [("c", "p", long + " evil", 1.0), ("c", "p", long, 1.0), ("a", "q", long, 1.0)]
    credits, added = credit_successes(samples, memory, min_chars=10, fits=fits)
    assert credits == [0.0, 0.0, 1.0]
    # c's fitting text is its own (remembered, so a later copy by another lab counts 0); its gated one is not
    assert added == [(response_key("p", long, 10), "c"), (response_key("q", long, 10), "a")]
    memory.add(*added[0])
    assert credit_successes([("b", "p", long, 1.0)], memory, 10, fits)[0] == [0.0]  # a copy: dedup as before
    assert credit_successes([("b", "p", long + " evil", 1.0)], memory, 10)[0] == [1.0]  # no gate: not a copy


def test_the_setting_is_checked_off_by_default_and_binds_the_journal(tmp_path) -> None:
    for bad in ("yes", 1, None):
        with pytest.raises(ValueError, match=rf"CoordinatorConfig.format_gate must be true or false, got {bad!r}"):
            make_config(tmp_path, format_gate=bad)
    off, on = make_config(tmp_path), make_config(tmp_path, format_gate=True)
    assert off.format_gate is False  # the built-in default: P̂ as docs/hacpo.md defines it
    assert "format_gate" not in off.plan_fingerprint()  # a journal of before the setting resumes
    assert on.plan_fingerprint()["format_gate"] is True  # and cannot be switched mid-run


def test_hacfed_sim_hands_format_gate_to_its_coordinator(tmp_path) -> None:
    import argparse

    from hacfed.tasks.registry import load_task
    from hacfed.tools import sim_cli
    from hacfed.tools.sim import SimConfig, _coordinator_config

    parser = argparse.ArgumentParser()
    sim_cli.add_parser(parser.add_subparsers())
    assert parser.parse_args(["sim", "--format-gate"]).format_gate
    assert not parser.parse_args(["sim"]).format_gate
    cfg = SimConfig(agents=("tiny-llama", "tiny-gpt2"), format_gate=True, state_dir=str(tmp_path))
    assert _coordinator_config(cfg, load_task(cfg.task), ["tiny-llama", "tiny-gpt2"]).format_gate
    assert not SimConfig().format_gate


# -- through the real coordinator --------------------------------------------------------------------


class _Honest:
    """An honest lab in the task's format: per group the worked solution once (none when not `solves`),
    then wrong answers; it claims its verifier's rewards (public answer keys)."""

    def __init__(self, participant_id: str, solves: bool = True) -> None:
        self.participant_id = participant_id
        self.solves = solves
        self.updates: list[RoundUpdate] = []

    def exchange(self, update: RoundUpdate) -> Submission:
        self.updates.append(update)
        plan = update.next_plan
        if plan is None:
            return Submission(update.run_id, self.participant_id, update.pool_round + 1, (),
                              StepReport(self.participant_id, update.pool_round + 1, {"loss": 0.1}, 0.5))
        rng = random.Random(f"{self.participant_id}/{plan.round_id}")
        out = []
        for planned in plan.prompts:
            problem = TASK.problem(planned.prompt_id)
            for k in range(plan.group_size):
                text = problem.solution if k == 0 and self.solves else f"Answer: {rng.randint(1000, 9999)}"
                out.append(Trajectory(f"{self.participant_id}/{plan.round_id}/{planned.prompt_id}/{k}",
                                      planned.prompt_id, self.participant_id, 0, planned.messages, text,
                                      TASK.verify(problem, text).reward, -20.0, 40, "stop"))
        return Submission(update.run_id, self.participant_id, plan.round_id, tuple(out), nonce=f"{plan.round_id:032x}")


class _Canary:
    """`hacfed sim`'s hostile:canary:TEXT lab as run_rounds sees it."""

    def __init__(self) -> None:
        self.participant_id = CANARY
        self.lab = ScriptedLab(CANARY, HostileSpec("canary", text=TEXT), TASK, seed=0)

    def exchange(self, update: RoundUpdate) -> Submission | None:
        return self.lab.step(update)


def _federation(tmp_path, gate: bool, dedup: bool = False, b_solves: bool = True) -> tuple[Coordinator, list[_Honest]]:
    cfg = make_config(tmp_path, rounds=ROUNDS, prompts_per_round=2, group_size=G, expected_participants=3,
                      min_participants=3, pool_peers_per_prompt=1, pool_peer_choice="successes",
                      format_gate=gate, dedup_successes=dedup, task=TASK_TABLE, sampling={"max_new_tokens": 64})
    coord = Coordinator(cfg, TASK, Journal(cfg.journal_path), clock=FakeClock())
    honest = [_Honest("lab-a"), _Honest("lab-b", solves=b_solves)]
    outcomes = run_rounds(coord, [*honest, _Canary()], sleep=coord.now)
    assert all(not o.results[CANARY].rejected for o in outcomes)  # every canary sample verified and accepted
    return coord, honest


def _peers(honest: list[_Honest], filtered: bool) -> list[set[str]]:
    """Per (honest learner, pooled prompt): the peers whose groups it trains on, after its inbound filter
    when `filtered` (hacfed.clients.textfilter, as each honest lab of `hacfed sim` applies it)."""
    flt = inbound(TASK)
    out = []
    for lab in honest:
        for update in lab.updates[1:]:  # the first update carries no pool
            pool = filter_pool(update.pool, lab.participant_id, flt)[0] if filtered else update.pool
            for prompt_id in {t.prompt_id for t in update.pool}:
                out.append({t.source_id for t in pool if t.prompt_id == prompt_id} - {lab.participant_id})
    assert len(out) == len(honest) * ROUNDS * 2
    return out


@pytest.mark.parametrize("dedup", [False, True])
def test_with_the_gate_each_honest_learner_is_sent_its_honest_peer(tmp_path, dedup) -> None:
    coord, honest = _federation(tmp_path, gate=True, dedup=dedup)
    capabilities = coord.capabilities()
    assert all(capabilities[pid] == pytest.approx(1 / G) for pid in HONEST)  # honest work counts as before
    assert capabilities[CANARY] < 1e-6  # every success outside the format: floored
    other = {"lab-a": "lab-b", "lab-b": "lab-a"}
    sent = _peers(honest, filtered=False)
    assert sent == [{other[lab.participant_id]} for lab in honest for _ in range(ROUNDS * 2)]
    assert _peers(honest, filtered=True) == sent  # and its inbound filter keeps it


def test_a_group_outside_the_format_ranks_below_an_honest_group_without_a_success(tmp_path) -> None:
    coord, honest = _federation(tmp_path, gate=True, b_solves=False)
    assert coord.capabilities()["lab-b"] < 1e-6 and coord.capabilities()[CANARY] < 1e-6  # both credited nothing
    # but lab-a is sent lab-b's failures, which its filter keeps, never the canary lab's group, which it drops
    assert _peers(honest[:1], filtered=True) == [{"lab-b"}] * (ROUNDS * 2)


def test_without_the_gate_the_canary_lab_takes_every_peer_slot(tmp_path) -> None:
    coord, honest = _federation(tmp_path, gate=False)
    assert coord.capabilities()[CANARY] == 1.0
    assert all(peers == {CANARY} for peers in _peers(honest, filtered=False))  # the most verified reward
    assert all(peers == set() for peers in _peers(honest, filtered=True))  # which the filter drops: no peer


@pytest.mark.parametrize("dedup", [False, True])
def test_the_credits_survive_a_coordinator_restart(tmp_path, dedup) -> None:
    coord, _ = _federation(tmp_path, gate=True, dedup=dedup)
    live = [coord.intake.group_credit(r) for r in range(ROUNDS)]
    assert all(v == REFUSED_GROUP for credit in live for (_, lab), v in credit.items() if lab == CANARY)
    coord.journal.close()
    again = Coordinator(coord.cfg, TASK, Journal(coord.cfg.journal_path), clock=FakeClock())
    assert [again.intake.group_credit(r) for r in range(ROUNDS)] == live  # judged again from the journal
    again.journal.close()
