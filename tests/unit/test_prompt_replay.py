"""Copied successes, with `dedup_successes` (docs/security.md, "Duplicate successes count once") and
without it. Four honest labs and a copier, through the real coordinator and its in-process round
driver (`run_rounds`), K = 2 peers per prompt chosen by `successes`.

Prompt replay: with the answer keys held by the coordinator (`answer_keys = "coordinator"`), a lab
keeps the verified peer successes it is sent and, when the same prompt recurs in a later plan,
submits them as its own: with the setting it gains neither P̂ nor reach; without it, both.
Copy-gold with public answer keys, on a task whose reference solutions are derivations: with the
setting its G copies count as one success, so it gains no more P̂ or reach than an honest lab that
solves one sample in G; without it, P̂ 1 and every learner."""

from __future__ import annotations

import random

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from hacfed.envelope import DOMAIN_UPDATE, key_id, open_envelope
from hacfed.messages import RoundUpdate, StepReport, Submission
from hacfed.server.coordinator import Coordinator, Journal
from hacfed.server.coordinator.pool_share import PoolShares, share_salt
from hacfed.server.coordinator.transport import run_rounds
from hacfed.server.round_updates import SealedUpdates
from hacfed.tasks.base import Problem, Verdict
from hacfed.tasks.chain import ChainTask
from hacfed.tools.hostile import HostileSpec, ScriptedLab
from hacfed.trajectory import Trajectory
from hacfed.wire import PayloadType, decode_round_update
from tests.unit.test_coordinator_fakes import FakeClock, make_config

TASK = ChainTask(terms=3, num_train=4, num_validation=1, num_eval=1)  # 4 prompts, 2 a round: they recur
TASK_TABLE = {"kind": "chain", "terms": 3, "num_train": 4, "num_validation": 1, "num_eval": 1}
REPLAYER = "hostile-replay"
HONEST = ("lab-a", "lab-b", "lab-c", "lab-d")
G, K, ROUNDS = 4, 2, 8


COPIER = "hostile-copy-gold"
PREFACE = "Add the numbers from left to right, writing down each partial sum on its own line:\n"


class _Derivations:
    """TASK with each reference solution a derivation (a sentence, then the worked steps), as GSM8K's are."""

    name = "chain-derivations"

    def _long(self, problem: Problem) -> Problem:
        return Problem(problem.prompt_id, problem.messages, problem.answer, PREFACE + problem.solution)

    def train_problems(self) -> tuple[Problem, ...]:
        return tuple(self._long(p) for p in TASK.train_problems())

    def eval_problems(self) -> tuple[Problem, ...]:
        return tuple(self._long(p) for p in TASK.eval_problems())

    def problem(self, prompt_id: str) -> Problem:
        return self._long(TASK.problem(prompt_id))

    def verify(self, problem: Problem, response: str) -> Verdict:
        return TASK.verify(problem, response)


def _sample(lab: str, round_id: int, planned, k: int, text: str, reward: float = 0.0) -> Trajectory:
    return Trajectory(f"{lab}/{round_id}/{planned.prompt_id}/{k}", planned.prompt_id, lab, 0, planned.messages,
                      text, reward, -20.0, 40, "stop")  # reward: the claim, none when the coordinator holds the answers


def _done(lab: str, update: RoundUpdate) -> Submission:
    return Submission(update.run_id, lab, update.pool_round + 1, (),
                      StepReport(lab, update.pool_round + 1, {"loss": 0.1}, 0.5))


class _Solver:
    """An honest lab: per group one worked solution in its own words (right), the rest wrong; it claims
    its verifier's rewards when the answers are public."""

    def __init__(self, participant_id: str) -> None:
        self.participant_id = participant_id
        self.updates: list[RoundUpdate] = []

    def exchange(self, update: RoundUpdate) -> Submission:
        self.updates.append(update)
        plan = update.next_plan
        if plan is None:
            return _done(self.participant_id, update)
        rng = random.Random(f"{self.participant_id}/{plan.round_id}")
        out = []
        for planned in plan.prompts:
            solution = TASK.problem(planned.prompt_id).solution
            for k in range(plan.group_size):
                if k == 0:
                    text = (f"{self.participant_id} adds one number at a time, writes down each step and checks "
                            f"every sum.\n{solution}")
                else:
                    text = f"{self.participant_id} guesses this one.\nAnswer: {rng.randint(1000, 9999)}"
                public = plan.answer_keys == "public"
                claim = TASK.verify(TASK.problem(planned.prompt_id), text).reward if public else 0.0
                out.append(_sample(self.participant_id, plan.round_id, planned, k, text, claim))
        return Submission(update.run_id, self.participant_id, plan.round_id, tuple(out),
                          nonce=f"{plan.round_id:032x}")


class _Replayer:
    """Remembers every peer success (verified reward > 0) it is sent, by prompt; for a planned prompt
    it remembers successes of, submits them (cycled to G), else a guess."""

    def __init__(self) -> None:
        self.participant_id = REPLAYER
        self.kept: dict[str, list[str]] = {}
        self.replayed = 0

    def exchange(self, update: RoundUpdate) -> Submission:
        for t in update.pool:
            if t.source_id != REPLAYER and t.reward > 0 and t.response_text not in self.kept.get(t.prompt_id, []):
                self.kept.setdefault(t.prompt_id, []).append(t.response_text)
        plan = update.next_plan
        if plan is None:
            return _done(REPLAYER, update)
        out = []
        for planned in plan.prompts:
            texts = self.kept.get(planned.prompt_id) or ["I cannot tell.\nAnswer: 0"]
            self.replayed += planned.prompt_id in self.kept
            out.extend(_sample(REPLAYER, plan.round_id, planned, k, texts[k % len(texts)]) for k in range(G))
        return Submission(update.run_id, REPLAYER, plan.round_id, tuple(out), nonce=f"{plan.round_id:032x}")


class _Copier:
    """`hacfed sim`'s hostile:copy-gold lab as run_rounds sees it: the reference solution G times."""

    def __init__(self) -> None:
        self.participant_id = COPIER
        self.lab = ScriptedLab(COPIER, HostileSpec("copy-gold"), _Derivations(), seed=0)

    def exchange(self, update: RoundUpdate) -> Submission | None:
        return self.lab.step(update)


def _federation(tmp_path, dedup: bool, copier: str = REPLAYER):
    """Run the four honest labs and `copier` (REPLAYER with the answer keys held by the coordinator,
    COPIER with public keys on `_Derivations`)."""
    replay = copier == REPLAYER
    cfg = make_config(tmp_path, rounds=ROUNDS, prompts_per_round=2, group_size=G, expected_participants=5,
                      min_participants=5, pool_peers_per_prompt=K, pool_peer_choice="successes",
                      answer_keys="coordinator" if replay else "public", dedup_successes=dedup, task=TASK_TABLE,
                      sampling={"max_new_tokens": 64})
    coord = Coordinator(cfg, TASK if replay else _Derivations(), Journal(cfg.journal_path), clock=FakeClock())
    honest = [_Solver(pid) for pid in HONEST]
    hostile = _Replayer() if replay else _Copier()
    outcomes = run_rounds(coord, [*honest, hostile], sleep=coord.now)
    if replay:
        assert hostile.replayed >= 4  # prompts recurred and it replayed peers' successes
    assert all(not o.results[copier].rejected for o in outcomes)  # every copied sample accepted
    return coord, honest


def _reach(honest: list[_Solver], source: str = REPLAYER) -> float:
    """The fraction of (honest learner, pooled prompt) pairs whose pool carried `source`'s group."""
    sent = total = 0
    for lab in honest:
        for update in lab.updates:
            if lab.participant_id == source:
                continue
            total += len({t.prompt_id for t in update.pool})
            sent += len({t.prompt_id for t in update.pool if t.source_id == source})
    assert total > 0
    return sent / total


def test_a_replaying_lab_gains_neither_capability_nor_reach_when_successes_count_once(tmp_path):
    coord, honest = _federation(tmp_path, dedup=True)
    capabilities = coord.capabilities()
    assert all(capabilities[pid] == pytest.approx(1 / G) for pid in HONEST)  # honest work counts as before
    assert capabilities[REPLAYER] < 1e-6  # every replayed success was first accepted from another lab
    assert _reach(honest) == 0.0  # its groups are credited 0: never among the K peers with most successes


def test_without_the_setting_replaying_pays_in_capability_and_reach(tmp_path):
    coord, honest = _federation(tmp_path, dedup=False)
    capabilities = coord.capabilities()
    assert all(capabilities[pid] == pytest.approx(1 / G) for pid in HONEST)
    assert capabilities[REPLAYER] > 2 * max(capabilities[pid] for pid in HONEST)  # the attack's gain
    assert _reach(honest) > 0.25  # sent in place of honest peers


def test_copy_gold_counts_as_one_success_a_group_with_public_answer_keys(tmp_path):
    coord, honest = _federation(tmp_path, dedup=True, copier=COPIER)
    capabilities = coord.capabilities()
    assert all(capabilities[pid] == pytest.approx(1 / G) for pid in HONEST)
    assert capabilities[COPIER] == pytest.approx(1 / G)  # G copies of the reference: one success per group
    assert _reach(honest, COPIER) <= max(_reach(honest, pid) for pid in HONEST)  # ties drawn: a fair share


def test_without_the_setting_copy_gold_pays_with_public_answer_keys(tmp_path):
    coord, honest = _federation(tmp_path, dedup=False, copier=COPIER)
    assert coord.capabilities()[COPIER] == 1.0
    assert _reach(honest, COPIER) == 1.0  # the most verified reward on every prompt: sent to every learner


def test_the_flower_driver_ranks_by_the_same_credits(tmp_path):
    """The updates the Flower round driver seals (`SealedUpdates`) leave the replayer's groups out as the
    in-process transport does, where the verified rewards alone would send them."""
    coord, _ = _federation(tmp_path, dedup=True)
    key = Ed25519PrivateKey.generate()
    pieces_for = SealedUpdates(coord.cfg, coord, key, console=lambda line: None).for_round(ROUNDS)
    pool = coord.engine.round_update(ROUNDS).pool
    by_reward = PoolShares(pool, K, share_salt(coord.cfg.run_id, coord.cfg.seed, ROUNDS), "successes")
    assert any(source == REPLAYER for lab in HONEST for _, source in by_reward.groups_for(lab))
    for lab in HONEST:
        payload, _ = open_envelope(b"".join(pieces_for(lab)), {key_id(key.public_key()): key.public_key()},
                                   DOMAIN_UPDATE, PayloadType.ROUND_UPDATE)
        sent = decode_round_update(payload).pool
        for prompt_id in {t.prompt_id for t in pool}:
            sources = {t.source_id for t in sent if t.prompt_id == prompt_id}
            assert REPLAYER not in sources and lab in sources and len(sources) == K + 1
