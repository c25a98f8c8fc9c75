"""Which part of a round's pool each lab is sent (hacfed.server.coordinator.pool_share,
hacfed.server.round_updates), and that the driver really sends it: own samples always, at most K
peers per prompt, the whole pool for <= K + 1 labs."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from hacfed.envelope import DOMAIN_UPDATE, key_id, open_envelope
from hacfed.messages import RoundUpdate
from hacfed.server.coordinator.pool_share import PoolShares, fitted_peers, shares_of
from hacfed.server.round_updates import RoundUpdates
from hacfed.trajectory import ChatMessage, Trajectory
from hacfed.wire import PayloadType, decode_round_update, encode_round_update
from tests.unit.test_coordinator_fakes import TASK, FakeClock, wrong_answer
from tests.unit.test_server_driver import Federation, ScriptedParticipant


class AnswersEverySample(ScriptedParticipant):
    """A scripted lab whose every sample is `text(gold answer)` with a claimed reward of 1.0: the
    gold itself makes the strongest lab, a wrong answer a liar."""

    def __init__(self, participant_id: str, text) -> None:
        super().__init__(participant_id)
        self._text = text

    def step(self, update, before_checkpoint=None):
        sub = super().step(update)
        samples = tuple(dataclasses.replace(t, response_text=(x := self._text(TASK.problem(t.prompt_id).answer)),
                                            reward=1.0, source_logp_sum=-0.5 * len(x), source_token_count=len(x))
                        for t in sub.trajectories)
        sub = dataclasses.replace(sub, trajectories=samples)
        if before_checkpoint is not None:
            before_checkpoint(sub)
        return sub


def make_pool(labs: int, prompts: int, group: int, text: str = "x") -> tuple[Trajectory, ...]:
    return tuple(
        Trajectory(f"{lab}-{p}-{g}", f"p{p}", f"lab-{lab:02d}", 1, (ChatMessage("user", f"q{p}"),), text, 0.5, -1.0, 3,
                   "stop")
        for lab in range(labs) for p in range(prompts) for g in range(group))


def sources_per_prompt(pool, indices) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for i in indices:
        out.setdefault(pool[i].prompt_id, set()).add(pool[i].source_id)
    return out


def test_few_labs_get_the_whole_pool() -> None:
    pool = make_pool(3, 4, 2)
    shares = PoolShares(pool, 2, "salt")
    assert len(shares.indices_for("lab-new")) < len(pool)  # a fourth lab, without samples, gets 2 of the 3
    for lab in ("lab-00", "lab-01", "lab-02"):
        assert shares.indices_for(lab) == tuple(range(len(pool)))


def test_many_labs_get_their_own_samples_and_k_peers_per_prompt() -> None:
    pool = make_pool(10, 6, 3)
    shares = PoolShares(pool, 3, "salt")
    for lab in range(10):
        me = f"lab-{lab:02d}"
        indices = shares.indices_for(me)
        assert list(indices) == sorted(set(indices))  # a sub-sequence of the pool
        assert {i for i, t in enumerate(pool) if t.source_id == me} <= set(indices)  # every own sample
        for prompt, sources in sources_per_prompt(pool, indices).items():
            assert me in sources and len(sources) == 1 + 3, (me, prompt, sources)
        # whole groups only: each chosen (prompt, source) comes with all G samples
        counts = Counter((pool[i].prompt_id, pool[i].source_id) for i in indices)
        assert set(counts.values()) == {3}
    assert shares.indices_for("lab-00") == PoolShares(pool, 3, "salt").indices_for("lab-00")  # deterministic
    assert shares.indices_for("lab-00") != PoolShares(pool, 3, "other").indices_for("lab-00")  # keyed by the salt


def test_every_peer_is_chosen_about_equally_often() -> None:
    pool = make_pool(16, 40, 1)
    shares = PoolShares(pool, 3, "run/0/5")
    sent = Counter()
    for lab in range(16):
        for i in shares.indices_for(f"lab-{lab:02d}"):
            if pool[i].source_id != f"lab-{lab:02d}":
                sent[pool[i].source_id] += 1
    assert sum(sent.values()) == 16 * 40 * 3
    expected = 16 * 40 * 3 / 16  # 120 per source
    assert all(0.6 * expected <= n <= 1.4 * expected for n in sent.values()), sent


def test_a_lab_without_samples_still_gets_k_peers() -> None:
    pool = make_pool(6, 2, 1)
    indices = PoolShares(pool, 2, "s").indices_for("lab-new")
    assert all(len(s) == 2 for s in sources_per_prompt(pool, indices).values())


def scored_pool(rewards: dict[tuple[int, int], list[float]]) -> tuple[Trajectory, ...]:
    """(lab, prompt) -> its group's rewards."""
    return tuple(
        Trajectory(f"{lab}-{p}-{g}", f"p{p}", f"lab-{lab:02d}", 1, (ChatMessage("user", f"q{p}"),), "x", r, -1.0, 3,
                   "stop")
        for (lab, p), group in sorted(rewards.items()) for g, r in enumerate(group))


def test_successes_choice_sends_the_peer_groups_with_the_most_verified_reward() -> None:
    # Four labs, three prompts: per prompt, the peer groups' rewards differ.
    rewards = {(0, 0): [0, 0], (1, 0): [1, 0], (2, 0): [1, 1], (3, 0): [0, 0],
               (0, 1): [1, 1], (1, 1): [0, 0], (2, 1): [0, 0], (3, 1): [1, 0],
               (0, 2): [0, 0], (1, 2): [1, 1], (2, 2): [0, 1], (3, 2): [1, 1]}
    pool = scored_pool({k: [float(r) for r in v] for k, v in rewards.items()})
    shares = PoolShares(pool, 1, "salt", "successes")
    sent = sources_per_prompt(pool, shares.indices_for("lab-00"))
    assert sent["p0"] == {"lab-00", "lab-02"}  # 2 successes beat 1 and 0
    assert sent["p1"] == {"lab-00", "lab-03"}
    assert sent["p2"] in ({"lab-00", "lab-01"}, {"lab-00", "lab-03"})  # a tie of two groups with 2 each
    two = sources_per_prompt(pool, PoolShares(pool, 2, "salt", "successes").indices_for("lab-01"))
    assert two["p0"] == {"lab-01", "lab-02", "lab-00"} or two["p0"] == {"lab-01", "lab-02", "lab-03"}
    assert two["p2"] == {"lab-01", "lab-03", "lab-02"}  # lab-03's 2 and lab-02's 1 beat lab-00's 0


def test_successes_choice_breaks_ties_in_the_drawn_order() -> None:
    """With equal rewards everywhere the choice is exactly the drawn one (the salt's keyed hash), so no
    lab is favoured by its id when nothing tells the groups apart."""
    pool = make_pool(10, 6, 3)  # every reward 0.5
    for lab in range(10):
        me = f"lab-{lab:02d}"
        assert PoolShares(pool, 2, "salt", "successes").indices_for(me) == PoolShares(pool, 2, "salt").indices_for(me)


def test_successes_choice_never_sends_fewer_successes_than_any_one_fixed_peer() -> None:
    """The property the choice exists for: with K = 1, a learner is sent, prompt by prompt, at least the
    verified reward of whichever single peer it would have been paired with (and so over the round)."""
    import random

    rng = random.Random(7)
    rewards = {(lab, p): [float(rng.random() < 0.3) for _ in range(4)] for lab in range(5) for p in range(30)}
    pool = scored_pool(rewards)
    for learner in range(5):
        got = PoolShares(pool, 1, "s", "successes").indices_for(f"lab-{learner:02d}")
        per_prompt = {}
        for i in got:
            if pool[i].source_id != f"lab-{learner:02d}":
                per_prompt[pool[i].prompt_id] = per_prompt.get(pool[i].prompt_id, 0.0) + pool[i].reward
        for p in range(30):
            best = max(sum(rewards[peer, p]) for peer in range(5) if peer != learner)
            assert per_prompt.get(f"p{p}", 0.0) == best, (learner, p)
        drawn = PoolShares(pool, 1, "s").indices_for(f"lab-{learner:02d}")
        assert sum(pool[i].reward for i in got) >= sum(pool[i].reward for i in drawn)


def test_a_bad_peer_choice_is_refused_by_name(tmp_path: Path) -> None:
    from tests.unit.test_coordinator_fakes import make_config

    with pytest.raises(ValueError, match="peer choice must be one of drawn, successes, got 'best'"):
        PoolShares((), 1, "s", "best")
    with pytest.raises(ValueError, match="pool_peer_choice.*'best'"):
        make_config(tmp_path, pool_peer_choice="best")
    assert make_config(tmp_path).pool_peer_choice == "drawn"


def test_round_updates_send_the_successes_choice() -> None:
    key = Ed25519PrivateKey.generate()
    rewards = {(lab, p): [float(lab == 2 and p != 1), 0.0] for lab in range(4) for p in range(3)}
    pool = scored_pool(rewards)
    update = RoundUpdate("run", 4, pool, {}, None)
    updates = RoundUpdates(update, key, peers_per_prompt=1, salt="s", peer_choice="successes")
    got = opened(updates.for_lab("lab-00"), key)
    assert got.pool == tuple(pool[i] for i in PoolShares(pool, 1, "s", "successes").indices_for("lab-00"))
    sent = sources_per_prompt(got.pool, range(len(got.pool)))
    assert sent["p0"] == sent["p2"] == {"lab-00", "lab-02"}


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_peers_per_prompt_is_validated(bad) -> None:
    with pytest.raises(ValueError, match=f"peers_per_prompt must be an int >= 0, got {bad!r}"):
        PoolShares((), bad, "s")


def opened(sealed: bytes, key: Ed25519PrivateKey) -> RoundUpdate:
    trusted = {key_id(key.public_key()): key.public_key()}
    payload, _ = open_envelope(sealed, trusted, DOMAIN_UPDATE, PayloadType.ROUND_UPDATE)
    return decode_round_update(payload)


def test_round_updates_are_signed_per_lab_selections() -> None:
    key = Ed25519PrivateKey.generate()
    pool = make_pool(6, 3, 2)
    update = RoundUpdate("run", 4, pool, {f"lab-{i:02d}": 0.5 for i in range(6)}, None,
                         tuple(f"lab-{i:02d}" for i in range(6)))
    updates = RoundUpdates(update, key, peers_per_prompt=2, salt="run/0/5")
    shares = PoolShares(pool, 2, "run/0/5")
    for lab in ("lab-00", "lab-03"):
        got = opened(updates.for_lab(lab), key)
        assert got.pool == tuple(pool[i] for i in shares.indices_for(lab))
        assert got.capabilities == update.capabilities and got.participants == update.participants  # P̂ of everyone
    assert updates.for_lab("lab-00") is updates.for_lab("lab-00")  # sealed once per round


def test_with_few_labs_one_update_is_shared_and_unchanged() -> None:
    key = Ed25519PrivateKey.generate()
    pool = make_pool(3, 3, 2)
    update = RoundUpdate("run", 0, pool, {}, None)
    updates = RoundUpdates(update, key, peers_per_prompt=7, salt="s")
    assert updates.for_lab("lab-00") is updates.for_lab("lab-02")
    payload, _ = open_envelope(updates.for_lab("lab-01"), {key_id(key.public_key()): key.public_key()},
                               DOMAIN_UPDATE, PayloadType.ROUND_UPDATE)
    assert payload == encode_round_update(update)  # exactly the update as it was sent before selections existed


def test_an_update_too_big_for_one_message_is_sent_with_fewer_peers() -> None:
    key = Ed25519PrivateKey.generate()
    pool = make_pool(4, 2, 2, text="y" * 2000)
    update = RoundUpdate("run", 0, pool, {}, None)
    lines: list[str] = []
    whole = len(encode_round_update(update))
    updates = RoundUpdates(update, key, peers_per_prompt=3, salt="s", console=lines.append, max_bytes=whole // 2)
    got = opened(updates.for_lab("lab-00"), key)
    assert len(encode_round_update(got)) <= whole // 2
    assert {t.source_id for t in got.pool if t.prompt_id == "p0"} >= {"lab-00"}
    assert sum(t.source_id == "lab-00" for t in got.pool) == 4  # all own samples kept
    assert len(lines) == 1 and "peers per prompt instead of 3, to fit in one message" in lines[0]
    opened(updates.for_lab("lab-01"), key)
    assert len(lines) == 1  # said once per round


def test_a_stale_update_is_cut_as_a_synchronous_one() -> None:
    """`pool_share.fitted_peers` (the Flower driver at max_staleness K >= 1) cuts a lab's share to the
    same peers per prompt and samples as `RoundUpdates` cuts a synchronous update, for every limit."""
    key = Ed25519PrivateKey.generate()
    pool = make_pool(4, 2, 2, text="y" * 2000)
    update = RoundUpdate("run", 0, pool, {}, None)
    shares = [shares_of(update, k, "s")("lab-00") for k in range(4)]
    sizes = [len(encode_round_update(share)) for share in shares]
    assert sizes[0] < sizes[1] < sizes[2] < sizes[3]
    for limit in (*sizes, sizes[0] - 1, sizes[2] + 1):
        k, left_out, size = fitted_peers(update, "lab-00", 3, "s", "drawn", limit)
        assert k == max([j for j in range(4) if sizes[j] <= limit], default=0), limit
        assert size == sizes[k] and left_out == len(shares[3].pool) - len(shares[k].pool)
        synchronous = RoundUpdates(update, key, peers_per_prompt=3, salt="s", max_bytes=limit)
        assert opened(synchronous.for_lab("lab-00"), key) == shares[k], limit


def test_driver_sends_each_lab_its_own_selection(tmp_path: Path) -> None:
    """Four real participant services, K = 1: every lab trains on its own samples plus one peer per prompt."""
    fed = Federation(tmp_path, FakeClock(), expected_participants=4, min_participants=4, pool_peers_per_prompt=1)
    for node in range(1, 5):
        fed.add(node, f"lab-{node}")
    fed.run()
    full = fed.driver.journal.pool(0)
    assert {t.source_id for t in full} == {"lab-1", "lab-2", "lab-3", "lab-4"}
    for _, (pid, service) in fed.nodes.items():
        update = service.participant.updates[1]  # the update carrying round 0's pool
        assert update.pool_round == 0
        mine = [t for t in update.pool if t.source_id == pid]
        assert len(mine) == sum(t.source_id == pid for t in full)
        for prompt, sources in sources_per_prompt(update.pool, range(len(update.pool))).items():
            assert pid in sources and len(sources) == 2, (pid, prompt, sources)
        assert set(update.capabilities) == {"lab-1", "lab-2", "lab-3", "lab-4"}


@pytest.mark.parametrize("bad", [0, -1, "7", True, 1.5, None])
def test_the_coordinator_setting_is_validated(tmp_path: Path, bad) -> None:
    from tests.unit.test_coordinator_fakes import make_config

    with pytest.raises(ValueError, match=f"pool_peers_per_prompt must be an integer >= 1, got {bad!r}"):
        make_config(tmp_path, pool_peers_per_prompt=bad)


def test_driver_sends_the_successes_choice(tmp_path: Path) -> None:
    """pool_peer_choice reaches the Flower driver: each lab's update is the successes selection of the
    journalled pool, under the salt both transports use."""
    from hacfed.server.coordinator.pool_share import share_salt

    fed = Federation(tmp_path, FakeClock(), expected_participants=4, min_participants=4, pool_peers_per_prompt=1,
                     pool_peer_choice="successes")
    for node in range(1, 4):
        fed.add(node, f"lab-{node}")
    # Solves every prompt: each of its groups holds G successes (the others' hold one).
    fed.add(4, "lab-4", participant=AnswersEverySample("lab-4", lambda gold: gold))
    fed.run()
    full = fed.driver.journal.pool(0)
    cfg = fed.driver.cfg
    for _, (pid, service) in fed.nodes.items():
        update = service.participant.updates[1]
        expected = PoolShares(full, 1, share_salt(cfg.run_id, cfg.seed, 1), "successes").indices_for(pid)
        assert update.pool == tuple(full[i] for i in expected)
        if pid != "lab-4":  # the strong lab's group is every other lab's one peer, on every prompt
            assert {t.source_id for t in update.pool} == {pid, "lab-4"}


def plain_selection(pool, learner: str, k: int, salt: str, choice: str) -> list[tuple[str, str]]:
    """The selection as the module's docstring states it, written the plain way (a list of peers per
    prompt, rotated from the drawn offset, stably sorted by reward for `successes`)."""
    shares = PoolShares(pool, k, salt, choice)  # only for its keyed offset
    sources: dict[str, set[str]] = {}
    reward: dict[tuple[str, str], float] = {}
    for t in pool:
        sources.setdefault(t.prompt_id, set()).add(t.source_id)
        reward[t.prompt_id, t.source_id] = reward.get((t.prompt_id, t.source_id), 0.0) + t.reward
    out = []
    for prompt, named in sources.items():
        peers = sorted(s for s in named if s != learner)
        if learner in named:
            out.append((prompt, learner))
        if len(peers) > k:
            start = shares._offset(learner, prompt, len(peers))
            peers = peers[start:] + peers[:start]
            if choice == "successes":
                peers.sort(key=lambda s: -reward[prompt, s])
            peers = peers[:k]
        out.extend((prompt, s) for s in peers)
    return sorted(out)


@pytest.mark.parametrize("choice", ["drawn", "successes"])
def test_selections_equal_the_plain_statement_of_the_rule(choice) -> None:
    """groups_for names peers by index arithmetic (no per-lab list, bench/coordinator_scale.py); it
    must choose exactly what the plain rule does, also where a lab skipped prompts and for a lab
    without samples."""
    import random

    rng = random.Random(3)
    pool = tuple(
        Trajectory(f"{lab}-{p}-{g}", f"p{p}", f"lab-{lab:02d}", 1, (ChatMessage("user", f"q{p}"),), "x",
                   float(rng.random() < 0.4), -1.0, 3, "stop")
        for lab in range(9) for p in range(40) for g in range(3) if not (lab == 3 and p % 5 == 0))
    for k in (0, 1, 2, 3, 8):
        shares = PoolShares(pool, k, "s2", choice)
        for learner in [f"lab-{lab:02d}" for lab in range(9)] + ["lab-new"]:
            assert sorted(shares.groups_for(learner)) == plain_selection(pool, learner, k, "s2", choice), (k, learner)


def test_claimed_rewards_do_not_buy_a_place_in_the_successes_choice(tmp_path: Path) -> None:
    """A hostile lab that claims reward 1.0 for wrong answers (so its claims promise the most
    successes) is ranked by the coordinator's re-verified rewards, never its claims: no other lab is
    sent its groups in place of an honest peer's verified successes."""
    from hacfed.server.coordinator.pool_share import share_salt

    fed = Federation(tmp_path, FakeClock(), expected_participants=4, min_participants=3, pool_peers_per_prompt=1,
                     pool_peer_choice="successes")
    for node in range(1, 4):
        fed.add(node, f"lab-{node}")
    fed.add(4, "liar", participant=AnswersEverySample("liar", wrong_answer))
    honest = [service.participant for _, (pid, service) in fed.nodes.items() if pid != "liar"]
    for _ in range(10):  # until every honest lab got round 0's pool (the liar, quarantined, keeps the run open)
        if all(len(p.updates) >= 2 for p in honest):
            break
        fed.exchange()
    assert all(len(p.updates) >= 2 for p in honest)
    full = fed.driver.journal.pool(0)
    assert {t.source_id for t in full} == {"lab-1", "lab-2", "lab-3"}  # every false claim was refused
    cfg = fed.driver.cfg
    for _, (pid, service) in fed.nodes.items():
        if pid == "liar":
            continue
        update = service.participant.updates[1]
        expected = PoolShares(full, 1, share_salt(cfg.run_id, cfg.seed, 1), "successes").indices_for(pid)
        assert update.pool == tuple(full[i] for i in expected)
        assert "liar" not in {t.source_id for t in update.pool}, pid
