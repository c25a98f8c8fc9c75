"""A lab's delivery sealed from its round update's envelope pieces (`seal_pieces`,
`delivery_parts_of`, `RoundUpdates.pieces_for_lab`, as `Deliveries.send` does) is byte for
byte the delivery sealed around the joined update (`seal_delivery`), which the lab opens with its
strict decoders; the pieces keep every check of the joined path (answers' caps, bytes only, the
envelope's size cap)."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from hacfed.envelope import DOMAIN_UPDATE, EnvelopeError, key_id, open_envelope, seal_parts, seal_pieces
from hacfed.exchange import open_delivery, seal_delivery
from hacfed.messages import RoundUpdate
from hacfed.server.round_updates import RoundUpdates
from hacfed.wire import PayloadType, decode_round_update
from hacfed.wire.framing import delivery_parts_of, encode_delivery
from hacfed.wire.types import MAX_DELIVERY_ITEMS, Delivery
from tests.unit.test_pool_share import make_pool

LABS = [f"lab-{i:02d}" for i in range(7)]


def _trusted(key: Ed25519PrivateKey) -> dict[bytes, object]:
    return {key_id(key.public_key()): key.public_key()}


@pytest.mark.parametrize("answers", [(), (b"a",), (b"first", b"x" * 300)])
@pytest.mark.parametrize("request_parts", [(), (b"",), (b"one",), (b"ab", b"", b"c" * 200)])
def test_delivery_from_pieces_is_the_delivery_of_the_joined_request(answers, request_parts) -> None:
    joined = encode_delivery(Delivery(answers, b"".join(request_parts)))
    assert b"".join(delivery_parts_of(answers, request_parts)) == joined


def test_pieces_keep_the_delivery_checks() -> None:
    with pytest.raises(ValueError, match="non-empty bytes"):
        delivery_parts_of((b"",), (b"x",))
    with pytest.raises(ValueError, match="items"):
        delivery_parts_of((b"a",) * (MAX_DELIVERY_ITEMS + 1), ())
    with pytest.raises(ValueError, match="str"):
        delivery_parts_of((), (b"x", "y"))


def test_seal_pieces_joined_is_seal_parts_and_keeps_the_cap() -> None:
    key = Ed25519PrivateKey.generate()
    parts = [b"ab", b"c" * 1000, b"d"]
    assert b"".join(seal_pieces(parts, PayloadType.ROUND_UPDATE, key, DOMAIN_UPDATE)) == \
        seal_parts(parts, PayloadType.ROUND_UPDATE, key, DOMAIN_UPDATE)
    with pytest.raises(EnvelopeError, match="exceeds the cap"):
        seal_pieces(parts, PayloadType.ROUND_UPDATE, key, DOMAIN_UPDATE, max_bytes=900)


@pytest.mark.parametrize("peers", [2, 7])  # per-lab selections; the whole pool, one shared update
def test_driver_style_delivery_is_what_seal_delivery_writes_and_the_lab_opens(peers: int) -> None:
    key = Ed25519PrivateKey.generate()
    pool = make_pool(7, 4, 3)
    update = RoundUpdate("run", 2, pool, {lab: 0.5 for lab in LABS}, None, tuple(LABS))
    updates = RoundUpdates(update, key, peers_per_prompt=peers, salt="run/0/3")
    answers = (seal_parts([b"receipt"], PayloadType.RECEIPT, key, DOMAIN_UPDATE),)
    for lab in LABS:
        pieces = updates.pieces_for_lab(lab)
        assert updates.pieces_for_lab(lab) is pieces and updates.for_lab(lab) is updates.for_lab(lab)
        assert b"".join(pieces) == updates.for_lab(lab)
        sealed = seal_parts(delivery_parts_of(answers, pieces), PayloadType.DELIVERY, key, DOMAIN_UPDATE)
        assert sealed == seal_delivery(answers, updates.for_lab(lab), key)  # Ed25519 is deterministic
        delivery = open_delivery(sealed, _trusted(key))
        assert delivery.answers == answers
        payload, _ = open_envelope(delivery.request, _trusted(key), DOMAIN_UPDATE, PayloadType.ROUND_UPDATE)
        got = decode_round_update(payload)
        assert got.pool_round == 2 and set(got.pool) <= set(pool) and len(got.pool) > 0
    if peers == 7:  # at most K + 1 labs: every lab shares one sealed update
        assert updates.for_lab(LABS[0]) is updates.for_lab(LABS[-1])


def test_a_tampered_update_inside_a_delivery_is_refused() -> None:
    key = Ed25519PrivateKey.generate()
    pool = make_pool(7, 4, 3)
    update = RoundUpdate("run", 2, pool, {lab: 0.5 for lab in LABS}, None, tuple(LABS))
    updates = RoundUpdates(update, key, peers_per_prompt=2, salt="s")
    pieces = list(updates.pieces_for_lab(LABS[0]))
    i = max(range(len(pieces)), key=lambda j: len(pieces[j]))  # a block of records
    pieces[i] = pieces[i][:-1] + bytes([pieces[i][-1] ^ 1])
    sealed = seal_parts(delivery_parts_of((), pieces), PayloadType.DELIVERY, key, DOMAIN_UPDATE)
    delivery = open_delivery(sealed, _trusted(key))  # the delivery's own signature covers what was sent
    with pytest.raises(EnvelopeError):
        open_envelope(delivery.request, _trusted(key), DOMAIN_UPDATE, PayloadType.ROUND_UPDATE)
