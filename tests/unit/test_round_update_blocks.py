"""A lab's round update spliced from per-group blocks is byte for byte the update of its selection
(`hacfed.server.round_updates`): for a pool in journal order (every group's samples consecutive)
and for one that is not (record-by-record splicing), with and without peers left out to fit; and
labs sealed from two threads (`hacfed.server.deliveries.in_threads`) get what one thread seals."""

from __future__ import annotations

import dataclasses
import random
import threading

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from hacfed.envelope import DOMAIN_UPDATE, key_id, open_envelope
from hacfed.messages import RoundUpdate
from hacfed.server.coordinator.pool_share import PoolShares
from hacfed.server.deliveries import in_threads
from hacfed.server.round_updates import RoundUpdates
from hacfed.wire import PayloadType, encode_round_update
from tests.unit.test_pool_share import make_pool

LABS = [f"lab-{i:02d}" for i in range(7)]


def _payload(sealed: bytes, key: Ed25519PrivateKey) -> bytes:
    payload, _ = open_envelope(sealed, {key_id(key.public_key()): key.public_key()}, DOMAIN_UPDATE,
                               PayloadType.ROUND_UPDATE)
    return payload


@pytest.mark.parametrize("order", ["journal", "shuffled"])
@pytest.mark.parametrize("max_bytes", [None, "a third"])
def test_every_labs_update_is_the_encoding_of_its_selection(order: str, max_bytes) -> None:
    key = Ed25519PrivateKey.generate()
    pool = make_pool(7, 4, 3, text="t" * 40)
    pool = tuple(dataclasses.replace(t, response_text=f"{t.trajectory_id} says {i}") for i, t in enumerate(pool))
    if order == "shuffled":
        pool = tuple(random.Random(3).sample(pool, len(pool)))
    update = RoundUpdate("run", 2, pool, {lab: 0.5 for lab in LABS}, None, tuple(LABS))
    limit = {} if max_bytes is None else {"max_bytes": len(encode_round_update(update)) * 35 // 100}  # k=1 fits
    updates = RoundUpdates(update, key, peers_per_prompt=2, salt="run/0/3", **limit)
    assert (updates._blocks is None) == (order == "shuffled")
    shares = PoolShares(pool, 2, "run/0/3")
    for lab in LABS:
        got = _payload(updates.for_lab(lab), key)
        for k in (2, 1, 0):  # the selection that fitted
            selection = tuple(pool[i] for i in shares.indices_for(lab, k))
            if got == encode_round_update(dataclasses.replace(update, pool=selection)):
                break
        else:
            raise AssertionError(f"{lab}: the update is no selection's encoding")
        assert k == (2 if max_bytes is None else 1)


def test_labs_sealed_from_two_threads_get_what_one_thread_seals() -> None:
    key = Ed25519PrivateKey.generate()
    pool = make_pool(7, 4, 3)
    update = RoundUpdate("run", 2, pool, {lab: 0.5 for lab in LABS}, None, tuple(LABS))
    alone = RoundUpdates(update, key, peers_per_prompt=2, salt="s")
    expected = {lab: _payload(alone.for_lab(lab), key) for lab in LABS}
    together = RoundUpdates(update, key, peers_per_prompt=2, salt="s")
    sealed = in_threads(together.for_lab, LABS * 2, 2)  # every lab asked twice, from both threads
    assert [_payload(s, key) for s in sealed] == [expected[lab] for lab in LABS * 2]
    assert all(sealed[i] is sealed[i + len(LABS)] for i in range(len(LABS)))  # sealed once per lab


def test_in_threads_keeps_the_order_uses_helpers_and_raises_the_first_error() -> None:
    seen: set[int] = set()

    def square(x: int) -> int:
        seen.add(threading.get_ident())
        if x == 97:
            raise ValueError("97 is not welcome")
        return x * x

    assert in_threads(square, list(range(50)), 2) == [x * x for x in range(50)]
    assert len(seen) == 2 and threading.get_ident() in seen
    assert in_threads(square, [3], 2) == [9] and in_threads(square, [], 2) == []
    with pytest.raises(ValueError, match="97 is not welcome"):
        in_threads(square, list(range(100)), 2)


def test_pool_records_with_prompts_encoded_once_are_each_trajectorys_own_encoding() -> None:
    from hacfed.proto import hacfed_v1_pb2 as pb
    from hacfed.trajectory import ChatMessage, Trajectory
    from hacfed.wire.convert import fill_trajectory
    from hacfed.wire.framing import length_delimited
    from hacfed.wire.pool_splice import encode_pool_items

    shared = (ChatMessage("system", "Box it."), ChatMessage("user", "q é \x00 \U0001f600"))
    values = [  # after a sample with every field set, one with defaults: nothing may be left over
        dict(policy_version=7, response_text="r", reward=1.0, source_logp_sum=-3.5, source_token_count=9,
             finish_reason="length", prompt=shared),
        dict(policy_version=0, response_text="", reward=0.0, source_logp_sum=0.0, source_token_count=0,
             finish_reason="stop", prompt=(ChatMessage("user", ""),)),
        dict(policy_version=2**40, response_text="x" * 300, reward=-0.0, source_logp_sum=-0.0, source_token_count=1,
             finish_reason="stop", prompt=shared),
        dict(policy_version=1, response_text="y", reward=1, source_logp_sum=-2, source_token_count=3,
             finish_reason="stop", prompt=(ChatMessage("assistant", "a"), ChatMessage("user", "b"))),
    ]
    pool = tuple(Trajectory(f"t{i}", f"p{i}", "lab", v["policy_version"], v["prompt"], v["response_text"],
                            v["reward"], v["source_logp_sum"], v["source_token_count"], v["finish_reason"])
                 for i, v in enumerate(values * 2))

    def own(t: Trajectory) -> bytes:
        m = pb.Trajectory()
        fill_trajectory(m, t)
        return length_delimited(3, m.SerializeToString(deterministic=True))

    assert list(encode_pool_items(pool)) == [own(t) for t in pool]
