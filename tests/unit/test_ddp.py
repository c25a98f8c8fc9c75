"""Data-parallel training inside a lab (hacfed.clients.distributed): 2 gloo ranks on CPU give the
same update as one process, and rollout sharding covers every prompt exactly once, in order.

The equivalence tests start a real second rank (a child process joined over loopback gloo) with
random-init tiny models, so they are marked slow."""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import signal

import pytest
import torch

from hacfed.clients.distributed import RankFailure, start_ranks
from hacfed.clients.participant import Participant, ParticipantConfig
from hacfed.clients.shards import global_scale, rollout_seed, shard_bounds, sub_plan
from hacfed.hacpo_config import HacpoConfig
from hacfed.messages import PlannedPrompt, RoundPlan, RoundUpdate, SamplingParams
from hacfed.models.zoo import build_untrained
from hacfed.tasks.arithmetic import ArithmeticTask

TASK = ArithmeticTask(digits=2, num_train=200, num_eval=20)


def plan(round_id: int, n: int = 4, g: int = 4, mode: str = "hacpo") -> RoundPlan:
    problems = TASK.train_problems()[round_id * n:(round_id + 1) * n]
    return RoundPlan(run_id="run", round_id=round_id,
                     prompts=tuple(PlannedPrompt(p.prompt_id, p.messages) for p in problems),
                     group_size=g, sampling=SamplingParams(max_new_tokens=6), hacpo=HacpoConfig(mode=mode))


# --- sharding (pure) ---------------------------------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 2, 3, 7, 16, 33])
@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_shards_cover_every_item_exactly_once_in_order(n: int, world: int) -> None:
    covered = [i for rank in range(world) for i in range(*shard_bounds(n, world, rank))]
    assert covered == list(range(n))  # each exactly once, and rank order restores the original order
    sizes = [hi - lo for lo, hi in (shard_bounds(n, world, r) for r in range(world))]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("world", [1, 2, 3])
def test_rollout_sharding_covers_every_prompt_exactly_once(world: int) -> None:
    full = plan(0, n=5)
    parts = [sub_plan(full, world, r) for r in range(world)]
    assert [p.prompt_id for part in parts for p in part.prompts] == list(full.prompt_ids)
    assert all(part.group_size == full.group_size and part.round_id == full.round_id for part in parts)
    assert len({rollout_seed(7, r) for r in range(world)}) == world and rollout_seed(7, 0) == 7


def test_shard_bounds_refuses_a_bad_rank() -> None:
    with pytest.raises(ValueError, match="rank=2"):
        shard_bounds(4, 2, 2)


def test_global_scale_makes_the_averaged_gradient_the_global_mean() -> None:
    # losses l_i of 5 rows split 3 + 2; each shard's loss is its own mean.
    rows = torch.tensor([0.5, -1.0, 2.0, 0.25, 3.0])
    shards = [rows[:3], rows[3:]]
    averaged = sum(s.mean() * global_scale(len(s), len(rows), 2) for s in shards) / 2  # what DDP's mean does
    assert math.isclose(float(averaged), float(rows.mean()), rel_tol=1e-6)
    assert global_scale(0, 5, 2) == 0.0


def test_nproc_is_checked() -> None:
    with pytest.raises(ValueError, match=r"ParticipantConfig.nproc must be an integer in 1..64, got 0"):
        ParticipantConfig("a", "tiny-llama", nproc=0)
    with pytest.raises(ValueError, match="ParticipantConfig.nproc must be 1 with rollout_backend 'vllm'"):
        ParticipantConfig("a", "tiny-llama", nproc=2, rollout_backend="vllm")


def test_client_nproc_flag_reaches_the_participant_and_bad_values_exit_2(tmp_path, capsys) -> None:
    from hacfed.clients.config import load_client_config
    from hacfed.clients.main import main
    from hacfed.keys import ensure_key_pair

    key = ensure_key_pair(tmp_path / "server", "coordinator").public
    argv = ["--participant-id", "lab-a", "--model", "tiny-llama", "--server", "127.0.0.1:9092", "--state-dir",
            str(tmp_path / "lab-a"), "--coordinator-key", str(key), "--insecure"]
    flags = {"participant_id": "lab-a", "model": "tiny-llama", "server": "127.0.0.1:9092",
             "state_dir": str(tmp_path / "lab-a"), "coordinator_key": str(key), "insecure": True, "nproc": 2}
    assert load_client_config(None, flags).participant.nproc == 2
    assert main([*argv, "--nproc", "0"]) == 2
    assert "ParticipantConfig.nproc must be an integer in 1..64, got 0" in capsys.readouterr().err
    assert main([*argv, "--nproc", "2", "--rollout-backend", "vllm"]) == 2
    assert "ParticipantConfig.nproc must be 1 with rollout_backend 'vllm'" in capsys.readouterr().err
    assert not (tmp_path / "lab-a").exists()  # refused before any file was created


# --- 2 ranks vs 1 process ----------------------------------------------------------------------


def make(pid: str, preset: str, **kw) -> Participant:
    model, tok = build_untrained(preset, seed=1)
    return Participant(ParticipantConfig(pid, preset, eval_problems=8, **kw), model, tok, TASK)


def params(p: Participant) -> torch.Tensor:
    return torch.cat([x.detach().flatten() for x in p.model.parameters() if x.requires_grad])


def mixed_pool(mode: str, finetune: str = "full"):
    """A pool of both agents' rollouts with rewards forced to vary (non-zero advantages)."""
    a, b = make("a", "tiny-llama", finetune=finetune), make("b", "tiny-gpt2")
    first = RoundUpdate("run", None, (), {"a": 1.0, "b": 1.0}, plan(0, mode=mode), ("a", "b"))
    sa, sb = a.step(first), b.step(first)
    both = sa.trajectories + sb.trajectories
    pool = [type(t)(**{**t.__dict__, "reward": float((i * 7) % 3 == 0)}) for i, t in enumerate(both)]
    return a, tuple(pool)


def compare(mode: str, minibatch: int | None, updates: int, finetune: str) -> None:
    a, pool = mixed_pool(mode, finetune)
    if minibatch:
        a.cfg = dataclasses.replace(a.cfg, minibatch_size=minibatch)
    twin = copy.deepcopy(a)  # same weights, optimizer, reference and own-sample cache
    before = params(a).clone()
    ranks = start_ranks(2, [twin])
    try:
        twin.attach_ranks(ranks)
        for r in range(updates):
            update = RoundUpdate("run", r, pool, {"a": 0.5, "b": 0.25}, None, ("a", "b"), hacpo=HacpoConfig(mode=mode))
            one = a.train_on_pool(update)
            two = twin.train_on_pool(update)
            assert one["num_updates"] == two["num_updates"] >= 2
            assert set(one) == set(two)
            # grad_norm is the all-reduced gradient's norm before clipping: a wrong loss scale shows here
            for key in one:
                assert math.isclose(one[key], two[key], rel_tol=1e-4, abs_tol=1e-6), (key, one[key], two[key])
            assert "kl" in one and "loss" in one and "grad_norm" in one
        p1, p2 = params(a), params(twin)
        moved = float((p1 - before).abs().max())
        diff = float((p1 - p2).abs().max())
        assert moved > 1e-5  # the updates changed the weights
        assert diff <= 1e-5 * max(1.0, float(p1.abs().max())), diff
        assert diff < 0.05 * moved, (diff, moved)  # far below what the updates moved
    finally:
        ranks.close()
    assert all(r.proc.poll() is not None for r in ranks._ranks)  # nothing left running


@pytest.mark.slow
@pytest.mark.parametrize("mode, minibatch, updates, finetune", [
    ("hacpo", None, 2, "full"),  # sequence-level loss, own + cross samples, KL; minibatch 8 -> shards 4 + 4
    ("grpo", 5, 2, "full"),  # token-level loss; shards 3 + 2, so each rank's own token count differs
    ("xhacpo", 1, 1, "full"),  # one-sample minibatches: rank 1 has no rows and must still join every backward
    ("hacpo", 7, 1, "lora"),  # only the adapter trains; the reference is the policy with it disabled
])
def test_two_ranks_train_like_one_process(mode: str, minibatch: int | None, updates: int, finetune: str) -> None:
    compare(mode, minibatch, updates, finetune)


@pytest.mark.slow
def test_two_ranks_roll_out_every_prompt_once_and_a_dead_rank_stops_the_lab() -> None:
    p = make("a", "tiny-llama")
    ranks = start_ranks(2, [p])
    try:
        p.attach_ranks(ranks)
        full = plan(2, n=5, g=3)
        out = p.rollout(full)
        assert [t.prompt_id for t in out] == [pid for pid in full.prompt_ids for _ in range(3)]
        assert len({t.trajectory_id for t in out}) == 15
        assert set(p.own_samples) == {t.trajectory_id for t in out}  # rank 0 keeps every rank's own samples
        assert all(t.reward == TASK.verify(TASK.problem(t.prompt_id), t.response_text).reward for t in out)
        pool = tuple(type(t)(**{**t.__dict__, "reward": float(i % 2)}) for i, t in enumerate(out))
        os.killpg(ranks._ranks[0].proc.pid, signal.SIGKILL)
        ranks._ranks[0].proc.wait()
        with pytest.raises(RankFailure, match=r"rank 1 \(pid \d+\) exited with code -9"):
            p.train_on_pool(RoundUpdate("run", 2, pool, {"a": 0.5}, None, ("a",)))
    finally:
        ranks.close()


@pytest.mark.slow
def test_a_rank_killed_during_training_fails_the_update_instead_of_hanging() -> None:
    import threading

    p = make("a", "tiny-llama")
    ranks = start_ranks(2, [p], timeout_s=120)  # the bound if gloo did not notice the closed peer
    try:
        p.attach_ranks(ranks)
        out = p.rollout(plan(0))
        pool = tuple(type(t)(**{**t.__dict__, "reward": float(i % 2)}) for i, t in enumerate(out))
        victim = ranks._ranks[0].proc.pid
        killer = threading.Timer(0.3, os.killpg, (victim, signal.SIGKILL))
        killer.start()
        with pytest.raises(RankFailure, match=rf"rank 1 \(pid {victim}\) exited with code -9"):
            for r in range(50):  # many updates: the kill lands inside one
                p.train_on_pool(RoundUpdate("run", r, pool, {"a": 0.5}, None, ("a",)))
        killer.join()
    finally:
        ranks.close()
