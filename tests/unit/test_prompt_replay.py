"""Prompt replay: with the answer keys held by the coordinator (`answer_keys = "coordinator"`), a lab
keeps the verified peer successes it is sent and, when the same prompt recurs in a later plan,
submits them as its own. With `dedup_successes` (docs/security.md, "Duplicate successes count once")
it gains neither P̂ nor reach; without it, it gains both. Four honest labs and the replayer, through
the real coordinator and its in-process round driver (`run_rounds`), K = 2 peers per prompt chosen
by `successes`."""

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
from hacfed.tasks.chain import ChainTask
from hacfed.trajectory import Trajectory
from hacfed.wire import PayloadType, decode_round_update
from tests.unit.test_coordinator_fakes import FakeClock, make_config

TASK = ChainTask(terms=3, num_train=4, num_validation=1, num_eval=1)  # 4 prompts, 2 a round: they recur
TASK_TABLE = {"kind": "chain", "terms": 3, "num_train": 4, "num_validation": 1, "num_eval": 1}
REPLAYER = "hostile-replay"
HONEST = ("lab-a", "lab-b", "lab-c", "lab-d")
G, K, ROUNDS = 4, 2, 8


def _sample(lab: str, round_id: int, planned, k: int, text: str) -> Trajectory:
    return Trajectory(f"{lab}/{round_id}/{planned.prompt_id}/{k}", planned.prompt_id, lab, 0, planned.messages,
                      text, 0.0, -20.0, 40, "stop")  # no claim: the coordinator holds the answers


def _done(lab: str, update: RoundUpdate) -> Submission:
    return Submission(update.run_id, lab, update.pool_round + 1, (),
                      StepReport(lab, update.pool_round + 1, {"loss": 0.1}, 0.5))


class _Solver:
    """An honest lab: per group one worked solution in its own words (right), the rest wrong."""

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
                    text = f"{self.participant_id} adds one number at a time, writes down each step and checks every sum.\n{solution}"
                else:
                    text = f"{self.participant_id} guesses this one.\nAnswer: {rng.randint(1000, 9999)}"
                out.append(_sample(self.participant_id, plan.round_id, planned, k, text))
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


def _federation(tmp_path, dedup: bool):
    cfg = make_config(tmp_path, rounds=ROUNDS, prompts_per_round=2, group_size=G, expected_participants=5,
                      min_participants=5, pool_peers_per_prompt=K, pool_peer_choice="successes",
                      answer_keys="coordinator", dedup_successes=dedup, task=TASK_TABLE,
                      sampling={"max_new_tokens": 64})
    coord = Coordinator(cfg, TASK, Journal(cfg.journal_path), clock=FakeClock())
    honest = [_Solver(pid) for pid in HONEST]
    replayer = _Replayer()
    outcomes = run_rounds(coord, [*honest, replayer], sleep=coord.now)
    assert replayer.replayed >= 4  # prompts recurred and it replayed peers' successes
    assert all(not o.results[REPLAYER].rejected for o in outcomes)  # every replayed sample accepted
    return coord, honest


def _reach(honest: list[_Solver]) -> float:
    """The fraction of (honest learner, pooled prompt) pairs whose pool carried the replayer's group."""
    sent = total = 0
    for lab in honest:
        for update in lab.updates:
            total += len({t.prompt_id for t in update.pool})
            sent += len({t.prompt_id for t in update.pool if t.source_id == REPLAYER})
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


def test_the_flower_driver_ranks_by_the_same_credits(tmp_path):
    """The updates the Flower round driver seals (`SealedUpdates`) leave the replayer's groups out as the
    in-process transport does, where the verified rewards alone would send them."""
    coord, _ = _federation(tmp_path, dedup=True)
    key = Ed25519PrivateKey.generate()
    pieces_for = SealedUpdates(coord.cfg, coord, key, console=lambda line: None).for_round(ROUNDS)
    pool = coord.make_update(ROUNDS).pool
    by_reward = PoolShares(pool, K, share_salt(coord.cfg.run_id, coord.cfg.seed, ROUNDS), "successes")
    assert any(source == REPLAYER for lab in HONEST for _, source in by_reward.groups_for(lab))
    for lab in HONEST:
        payload, _ = open_envelope(b"".join(pieces_for(lab)), {key_id(key.public_key()): key.public_key()},
                                   DOMAIN_UPDATE, PayloadType.ROUND_UPDATE)
        sent = decode_round_update(payload).pool
        for prompt_id in {t.prompt_id for t in pool}:
            sources = {t.source_id for t in sent if t.prompt_id == prompt_id}
            assert REPLAYER not in sources and lab in sources and len(sources) == K + 1
