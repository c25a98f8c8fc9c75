"""R11, the lab's side: after `hacfed-server purge --participant lab-x --from-round 1`, lab-a rolls
back to its last checkpoint without lab-x's samples and trains again on the pools since, without
them; deterministically, on CPU, with a tiny model (random-init tiny-llama; lab-x is a tiny-gpt2).

Four rounds run through lab-a's real participant service (its outbox keeps the signed updates);
pools hold lab-a's real rollouts and scripted samples of lab-b and lab-x.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from hacfed.clients.checkpoints import latest_checkpoint, read_state
from hacfed.clients.main import main as client_main
from hacfed.clients.outbox import Outbox
from hacfed.clients.participant import Participant, ParticipantConfig
from hacfed.clients.replay import ReplayError, replay
from hacfed.clients.service import OUTBOX_FILE, ParticipantService
from hacfed.envelope import DOMAIN_UPDATE, seal
from hacfed.exchange import seal_delivery
from hacfed.keys import ensure_key_pair
from hacfed.messages import RoundUpdate
from hacfed.models.zoo import build_untrained
from hacfed.wire import PayloadType, encode_round_update
from tests.unit.test_coordinator_fakes import scripted_trajectories
from tests.unit.test_participant import TASK, plan

IDS = ("lab-a", "lab-b", "lab-x")


def _lab_a(state: Path) -> Participant:
    model, tok = build_untrained("tiny-llama", seed=1)
    cfg = ParticipantConfig("lab-a", "tiny-llama", eval_problems=8, checkpoint_dir=str(state / "checkpoints"),
                            keep_checkpoints=6)
    return Participant(cfg, model, tok, TASK)


def _params(p: Participant) -> torch.Tensor:
    return torch.cat([x.detach().flatten() for x in p.model.parameters()])


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    """lab-a's state dir after 4 exchanges (pools of rounds 0, 1, 2 trained on), the coordinator's
    key, and lab-a's final parameters. Pools: lab-a's own rollouts, and scripted samples of lab-b
    and lab-x with mixed rewards (an untrained model gets everything wrong: no learning signal)."""
    tmp = tmp_path_factory.mktemp("replay")
    key = ensure_key_pair(tmp / "server", "coordinator").load()
    state = tmp / "lab-a"
    service = ParticipantService(_lab_a(state), TASK, ensure_key_pair(state, "participant").load(), key.public_key(),
                                 state / "service")
    pool, pool_round = (), None
    for r in range(4):
        caps = {"lab-a": 0.5, "lab-b": 0.5, "lab-x": 1.0}
        update = RoundUpdate("run", pool_round, pool, caps, plan(r, n=2, g=2), IDS)
        request = seal(encode_round_update(update), PayloadType.ROUND_UPDATE, key, DOMAIN_UPDATE)
        service.handle(seal_delivery((), request, key))
        assert service.outbox.entries()[-1].round_id == r
        mine = tuple(t.without_local_ids() for t in service.participant.own_samples.values())
        others = scripted_trajectories(update.next_plan, "lab-b") + scripted_trajectories(update.next_plan, "lab-x")
        pool, pool_round = mine + tuple(others), r
    service.outbox.close()
    return state, key.public_key(), _params(service.participant)


def _replayed(federation, tmp_path: Path, name: str, exclude: str = "lab-x", from_round: int = 1):
    state, coordinator_key, _ = federation
    copy = tmp_path / name
    shutil.copytree(state, copy)
    participant = _lab_a(copy)
    seen: list[set[str]] = []
    train = participant.train_on_pool

    def recording(update):
        seen.append({t.source_id for t in update.pool})
        return train(update)

    participant.train_on_pool = recording  # type: ignore[method-assign]
    outbox = Outbox(copy / "service" / OUTBOX_FILE)
    report = replay(participant, copy / "checkpoints", outbox, coordinator_key, exclude, from_round)
    outbox.close()
    return copy, participant, report, seen


def test_replay_rolls_back_and_trains_again_without_the_purged_lab(federation, tmp_path):
    _, _, contaminated = federation
    copy, participant, report, seen = _replayed(federation, tmp_path, "one")
    # pool k is trained on in the step that rolls out plan k + 1: the clean checkpoint is that of plan 1
    assert report.clean_checkpoint.startswith("ckpt-000001") and report.pools == (1, 2)
    assert report.excluded == {1: 4, 2: 4}  # lab-x's 2 prompts x 2 samples in each
    assert seen == [{"lab-a", "lab-b"}, {"lab-a", "lab-b"}]  # lab-x's samples never reached training
    latest = latest_checkpoint(copy / "checkpoints")
    state = read_state(latest)
    assert latest.name == report.checkpoint and latest.name.startswith("ckpt-000003-replay")
    assert state["round"] == 3 and state["pool_round"] == 2  # the lab resumes where it was
    assert not torch.equal(_params(participant), contaminated)
    at_clean = _lab_a(copy)
    at_clean.resume(copy / "checkpoints", copy / "checkpoints" / report.clean_checkpoint)
    assert not torch.equal(_params(participant), _params(at_clean))  # it did train on the clean pools
    # hacfed-client resumes from the replayed checkpoint
    assert torch.equal(_params(_lab_a(copy)), _params(participant))


def test_replay_is_deterministic(federation, tmp_path):
    _, first, _, _ = _replayed(federation, tmp_path, "a")
    _, second, _, _ = _replayed(federation, tmp_path, "b")
    assert torch.equal(_params(first), _params(second))


def test_nothing_to_replay_and_no_clean_checkpoint(federation, tmp_path):
    _, participant, report, seen = _replayed(federation, tmp_path, "other", exclude="lab-nobody")
    assert report.checkpoint is None and seen == []
    state, coordinator_key, _ = federation
    copy = tmp_path / "pruned"
    shutil.copytree(state, copy)
    for ckpt in (copy / "checkpoints").glob("ckpt-00000[012]*"):
        shutil.rmtree(ckpt)
    with pytest.raises(ReplayError, match="no kept checkpoint predates round 1"):
        replay(_lab_a(copy), copy / "checkpoints", Outbox(copy / "service" / OUTBOX_FILE), coordinator_key,
               "lab-x", 1)


def test_cli_replay_runs_from_the_labs_usual_flags(federation, tmp_path, capsys):
    state, _, _ = federation
    copy = tmp_path / "cli"
    shutil.copytree(state, copy)
    model_dir = tmp_path / "model"
    model, tok = build_untrained("tiny-llama", seed=1)
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    argv = ["replay", "--model", str(model_dir), "--participant-id", "lab-a", "--state-dir", str(copy),
            "--coordinator-key", str(state.parent / "server" / "coordinator.pub"), "--insecure",
            "--exclude", "lab-x", "--from-round", "1"]
    assert client_main(argv) == 0
    out = capsys.readouterr().out
    assert "rolled back to ckpt-000001" in out and "without lab-x's samples (8 left out)" in out
    assert "saved ckpt-000003-replay" in out
    assert client_main([*argv[:-1], "9"]) == 0  # nothing after round 9: nothing to replay
    assert client_main(["replay", "--model", str(model_dir), "--participant-id", "lab-a",
                        "--state-dir", str(tmp_path / "none"),
                        "--coordinator-key", str(state.parent / "server" / "coordinator.pub"), "--insecure",
                        "--exclude", "lab-x", "--from-round", "1"]) == 2
    assert "holds no outbox or checkpoint of a lab" in capsys.readouterr().err
