"""Per-partner trust learned by a lab (hacfed.clients.trust), the answer-form drift
(hacfed.clients.answer_form), and both kept across a checkpoint, worked by hand."""

from __future__ import annotations

import math

import pytest
import torch

from hacfed.algorithm import HacpoConfig
from hacfed.clients.answer_form import AnswerFormDrift, answer_form
from hacfed.clients.checkpoints import restore_participant, save_participant
from hacfed.clients.trust import PartnerTrust, trust_signal

CFG = HacpoConfig(mode="xhacpo", trust_rate=0.5)  # target .25, floor .01


def counts(partner: str, short: int, useful: int) -> dict[str, float]:
    """An update's metrics as `partner_rules` writes them for one partner."""
    return {f"partner/{partner}/short_prompts": float(short), f"partner/{partner}/useful_prompts": float(useful)}


def test_signal_by_hand():
    assert trust_signal(0, 0, 0.25) is None  # no prompt where the learner fell short: no evidence
    assert trust_signal(4, 0, 0.25) == -1.0
    assert trust_signal(8, 1, 0.25) == 0.0  # y = 1/8 = half the target
    assert trust_signal(4, 1, 0.25) == 1.0  # y = target
    assert trust_signal(16, 1, 0.25) == pytest.approx(-0.5)  # 2 · (1/16) / .25 − 1


def test_a_useless_partner_falls_below_a_tenth_within_five_updates_and_a_helpful_one_does_not():
    trust = PartnerTrust()
    weights = []
    for _ in range(5):
        # weak: answers 4 of the prompts the learner failed, never usefully; kind: rescues 1 of 4
        trust.update({**counts("weak", 4, 0), **counts("kind", 4, 1)}, CFG)
        weights.append(trust.weights())
    # weak: e^−.5k = .606531, .367879, .223130, .135335, .082085
    assert [w["weak"] for w in weights] == pytest.approx([math.exp(-0.5 * k) for k in range(1, 6)], abs=1e-12)
    assert weights[3]["weak"] > 0.1 > weights[4]["weak"]
    assert all(w["kind"] == 1.0 for w in weights)  # capped at neutral
    assert trust.metrics() == {"trust/kind": 1.0, "trust/weak": pytest.approx(0.082085, abs=1e-6)}
    # a partner that starts helping regains e^.5 per update; the floor holds a long-useless one
    trust.update(counts("weak", 4, 1), CFG)
    assert trust.weights()["weak"] == pytest.approx(math.exp(-2.0), abs=1e-12)
    for _ in range(20):
        trust.update(counts("weak", 4, 0), CFG)
    assert trust.weights()["weak"] == 0.01


def test_trust_off_and_no_evidence_change_nothing():
    trust = PartnerTrust()
    trust.update(counts("weak", 4, 0), HacpoConfig(mode="xhacpo"))  # trust_rate 0
    trust.update(counts("weak", 0, 0), CFG)  # no short prompt
    assert trust.weights() == {} and trust.metrics() == {}
    with pytest.raises(ValueError, match="trust weight of 'x'"):
        PartnerTrust({"x": 0.0})


def test_answer_forms_by_hand():
    assert [answer_form(t) for t in ("80", " -3.5.\n", "1,200", "The answer is 80.", "Hmm\n\nno idea", " \n")] == [
        "number-only", "number-only", "number-only", "number-in-text", "no-number", "empty"]
    drift = AnswerFormDrift()
    assert drift.observe([]) is None and drift.start is None
    # first rollout: 2 sentences, 1 bare number -> the starting form is number-in-text
    assert drift.observe(["It is 4.", "So 5", "6"]) == pytest.approx(2 / 3)
    assert drift.start == "number-in-text"
    assert drift.observe(["7", "8", "9", "The sum is 10"]) == 0.25  # drifting to bare numbers
    with pytest.raises(ValueError):
        AnswerFormDrift("bare")


def test_learner_state_survives_a_checkpoint(tmp_path):
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    state = {"trust": {"weak": 0.082085}, "answer_form_start": "number-in-text", "pool_temperature": 0.7}
    save_participant(tmp_path, participant_id="me", last_round=3, policy_version=3, capabilities={"me": 0.5},
                     config={}, model=model, optimizer=optimizer, own={}, learner_state=state)
    restored = restore_participant(tmp_path, "me", model, optimizer)
    assert restored.learner_state == state
    assert PartnerTrust(restored.learner_state["trust"]).weights() == {"weak": 0.082085}
