"""Bounded staleness with real tiny participants (the warmed-up tiny-llama and tiny-gpt2 presets): K = 0
is the synchronous federation bit for bit, and with K >= 1 no lab trains on a sample older than K rounds
(docs/staleness.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hacfed.clients.participant import Participant, ParticipantConfig
from hacfed.messages import SamplingParams
from hacfed.models.loading import load_model
from hacfed.server.coordinator import Coordinator, CoordinatorConfig, Journal
from hacfed.server.coordinator.transport import run_rounds
from hacfed.tasks.registry import load_task

TASK_SPEC = {"kind": "arithmetic", "digits": 2, "operators": "+", "num_train": 200, "num_eval": 8}
LABS = (("a", "tiny-llama"), ("b", "tiny-gpt2"))
ROUNDS = 4
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# What the synchronous federation (`run_rounds`, mode hacpo) gave for `_federation` before bounded
# staleness existed: per round and lab (reward_mean, capability, train loss), to 1e-6 (other CPUs
# may round differently). K = 0 on the paced clock must give the same, bit for bit (the test below).
GOLDEN = json.loads((FIXTURES / "staleness_golden.json").read_text()) \
    if (FIXTURES / "staleness_golden.json").exists() else None


def _federation(tmp_path: Path, max_staleness: int = 0, speeds: dict | None = None, paced: bool = False):
    """(rows by (round, lab), step records or {}, {lab: participant}) of a 4-round federation of two
    tiny labs, mode hacpo (the default HacpoConfig), on the same seeds whatever the transport."""
    task = load_task(TASK_SPEC)
    cfg = CoordinatorConfig(
        run_id="stale", task=TASK_SPEC, rounds=ROUNDS, prompts_per_round=2, group_size=4, expected_participants=2,
        min_participants=2, round_deadline_s=3600.0, state_dir=tmp_path, eval_every=2,
        sampling=SamplingParams(max_new_tokens=6), **({"max_staleness": max_staleness} if max_staleness else {}),
    )
    labs = {}
    for pid, preset in LABS:
        loaded = load_model(preset)
        model, tok = loaded.model, loaded.tokenizer
        pcfg = ParticipantConfig(pid, preset, eval_problems=4, learning_rate=5e-5, minibatch_size=4)
        labs[pid] = Participant(pcfg, model, tok, task)
    rows: dict = {}

    def keep(outcome) -> None:
        for m in outcome.summary.participants:
            train = {k: v for k, v in m.train_metrics.items() if not k.startswith("time_")}
            rows[(outcome.round_id, m.participant_id)] = (m.reward_mean, m.accepted, m.capability, m.eval_accuracy,
                                                          train)

    records = {}
    with Journal(cfg.journal_path) as journal:
        coordinator = Coordinator(cfg, task, journal)
        endpoints = [_Endpoint(p) for p in labs.values()]
        if paced:
            from hacfed.server.coordinator.transport import run_paced
            from hacfed.tools.sim_paced import flop_cost

            _, records = run_paced(coordinator, endpoints, speeds or {}, flop_cost(endpoints),
                                   on_round=keep)
        else:
            run_rounds(coordinator, endpoints, on_round=keep)
    return rows, records, labs


class _Endpoint:
    def __init__(self, participant: Participant) -> None:
        self.inner = participant
        self.participant_id = participant.participant_id

    def exchange(self, update):
        return self.inner.step(update)


def _golden_of(rows: dict, labs: dict) -> dict:
    return {"rows": {f"{r}/{pid}": [v[0], v[2], v[4].get("loss")] for (r, pid), v in sorted(rows.items())}}


@pytest.fixture(scope="module", autouse=True)
def presets(zoo_presets):
    zoo_presets(*(preset for _, preset in LABS))


@pytest.fixture(scope="module")
def synchronous(tmp_path_factory, presets):
    return _federation(tmp_path_factory.mktemp("sync"))


def test_k0_on_the_paced_clock_is_the_synchronous_federation_bit_for_bit(synchronous, tmp_path):
    rows, _, labs = synchronous
    paced_rows, records, paced_labs = _federation(tmp_path, 0, {"b": 4.0}, paced=True)
    assert paced_rows == rows  # every reward, count, P̂, evaluation and training metric, exactly
    for pid in labs:
        for (name, a), (_, b) in zip(labs[pid].model.state_dict().items(), paced_labs[pid].model.state_dict().items()):
            assert torch.equal(a, b), f"{pid} {name}"
    # The synchronous schedule: a fast lab idles while the slow one computes, and nothing is stale.
    assert all(set(r.staleness) <= {0} for r in records.values())
    assert sum(r.idle for (pid, _), r in records.items() if pid == "a") > 0
    assert sum(r.idle for (pid, _), r in records.items() if pid == "b") == 0


def test_k0_is_pinned_to_the_synchronous_federation_before_staleness_existed(synchronous):
    rows, _, labs = synchronous
    assert GOLDEN is not None, "tests/fixtures/staleness_golden.json is missing"
    got = _golden_of(rows, labs)
    assert got["rows"].keys() == GOLDEN["rows"].keys()
    for key, values in GOLDEN["rows"].items():
        for value, want in zip(got["rows"][key], values):
            assert value == (want if want is None else pytest.approx(want, rel=1e-6, abs=1e-9)), key


@pytest.mark.parametrize("k", [1, 2])
def test_no_lab_trains_on_a_sample_older_than_k_rounds(tmp_path, k, presets):
    _, records, _ = _federation(tmp_path, k, {"b": 4.0}, paced=True)
    assert max(s for r in records.values() for s in r.staleness) == k  # stale samples happen, and reach K
    assert all(max(r.staleness, default=0) <= k for r in records.values())
    # Every lab trains on every accepted sample exactly once: 2 labs x ROUNDS rounds x 2 prompts x G 4.
    for pid, _ in LABS:
        assert sum(len(r.staleness) for (lab, _), r in records.items() if lab == pid) == 2 * ROUNDS * 8
    # The fast lab never waits for the slow one more than the bound forces it to.
    fast = [records[("a", t)] for t in range(ROUNDS + 1)]
    assert sum(r.idle for r in fast) < sum(records[("b", t)].compute for t in range(ROUNDS + 1))


def test_joining_the_newest_round_with_real_labs_rows_own_steps_and_evaluations(tmp_path, presets):
    """round_join "newest" (docs/staleness.md): tiny-gpt2 4 times slower takes fewer rounds; every row is a
    round its lab took, numbered by its own steps; each lab evaluates every 2 of its own steps and at its
    final update; no sample is older than K = 3 rounds."""
    from hacfed.tools.sim import SimConfig, run_sim

    cfg = SimConfig(agents=tuple(preset for _, preset in LABS), mode="hacpo", rounds=8, prompts_per_round=2,
                    group_size=4, eval_every=2, eval_problems=4, task=TASK_SPEC, state_dir=str(tmp_path),
                    lab_speeds=(("tiny-gpt2", 4.0),), max_staleness=3, round_join="newest")
    rows = run_sim(cfg, progress=False)
    steps = {}
    for agent in ("tiny-llama", "tiny-gpt2"):
        mine = [r for r in rows if r["agent"] == agent]
        *taken, final = mine
        assert final["final"] is True and final["round"] == 8 and "eval_accuracy" in final
        assert [r["sim/own_step"] for r in mine] == list(range(len(mine)))  # rounds taken, then the final
        assert [r["round"] for r in taken] == sorted({r["round"] for r in taken})
        assert [r["sim/own_step"] for r in taken if "eval_accuracy" in r] == list(range(0, len(taken), 2))
        assert all(r.get("sim/staleness_max", 0) <= 3 for r in mine)
        steps[agent] = len(taken)
    assert steps["tiny-llama"] == 8 and steps["tiny-gpt2"] < 8  # the slow lab skipped rounds
    # The fast lab waits less than the slow one computes; the slow lab is sent of the fast lab only its
    # newest round per step, the older ones it skipped are counted (docs/staleness.md).
    idle = sum(r["sim/idle_s"] for r in rows if r["agent"] == "tiny-llama")
    assert idle < sum(r["sim/compute_s"] for r in rows if r["agent"] == "tiny-gpt2")
    slow = [r for r in rows if r["agent"] == "tiny-gpt2"]
    assert sum(r["sim/skipped_samples"] for r in slow) > 0
    assert all(r["sim/trained_samples"] <= 2 * 2 * 4 for r in slow)  # own round + one of the peer's
    assert all(r["sim/skipped_samples"] == 0 for r in rows if r["agent"] == "tiny-llama")


if __name__ == "__main__":  # regenerate the golden file from the synchronous federation
    import sys
    import tempfile

    rows, _, labs = _federation(Path(tempfile.mkdtemp()))
    Path(sys.argv[1]).write_text(json.dumps(_golden_of(rows, labs), indent=1, sort_keys=True) + "\n")
