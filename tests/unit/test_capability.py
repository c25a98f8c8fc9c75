"""CapabilityTracker (docs/hacpo.md §2) including the federated cases: dropped and late agents."""

from __future__ import annotations

import pytest

from hacfed.capability import CapabilityTracker


def test_no_history_means_one():
    tracker = CapabilityTracker(["a", "b"])
    assert tracker.capabilities() == {"a": 1.0, "b": 1.0}


def test_window_mean_of_per_step_success_rates():
    tracker = CapabilityTracker(["a", "b"], window=3)
    # step 1: a hits 1/4, b hits 2/2 -> P_a = .25, P_b = 1
    tracker.update([1, 0, 0, 0, 1, 1], ["a"] * 4 + ["b"] * 2)
    # step 2: a 3/4 = .75 ; b 0/2 = 0 -> P̂_a = (.25 + .75) / 2 = .5, P̂_b = (1 + 0) / 2 = .5
    caps = tracker.update([1, 1, 1, 0, 0, 0], ["a"] * 4 + ["b"] * 2)
    assert caps == pytest.approx({"a": 0.5, "b": 0.5})
    # steps 3, 4: a 1, 1 -> window [.75, 1, 1] (step 1 dropped) -> 2.75 / 3 = .916667
    tracker.update([1], ["a"])
    caps = tracker.update([1], ["a"])
    assert caps["a"] == pytest.approx(2.75 / 3)
    # b was absent in steps 3-4 (a dropped lab): its history is unchanged
    assert caps["b"] == pytest.approx(0.5)


def test_reward_above_zero_counts_as_success_and_floor_applies():
    tracker = CapabilityTracker(["a"], window=5, minimum=1e-8)
    caps = tracker.update([0.0, 0.0], ["a", "a"])
    assert caps["a"] == 1e-8  # all failures -> floored, never 0
    caps = tracker.update([0.3, 0.0], ["a", "a"])  # 0.3 > 0 counts as a hit -> P = .5
    assert caps["a"] == pytest.approx((0.0 + 0.5) / 2)


def test_new_agent_added_later_and_unknown_rejected():
    tracker = CapabilityTracker(["a"])
    tracker.update([1, 0], ["a", "a"])
    with pytest.raises(ValueError, match="'c'"):
        tracker.update([1], ["c"])
    tracker.add_agent("c")
    assert tracker.capabilities()["c"] == 1.0  # no history yet
    caps = tracker.update([1, 0, 0, 0], ["a", "a", "c", "c"])
    assert caps == pytest.approx({"a": (0.5 + 0.5) / 2, "c": 1e-8})
    with pytest.raises(ValueError, match="already tracked"):
        tracker.add_agent("a")


def test_state_round_trip():
    tracker = CapabilityTracker(["a", "b"], window=2)
    tracker.update([1, 0, 1], ["a", "b", "b"])
    tracker.update([0, 1], ["a", "b"])
    clone = CapabilityTracker([], window=2)
    clone.load_state_dict(tracker.state_dict())
    assert clone.capabilities() == tracker.capabilities()
    assert clone.update([1], ["b"]) == tracker.update([1], ["b"])
    with pytest.raises(ValueError, match="window"):
        CapabilityTracker([], window=5).load_state_dict(tracker.state_dict())


def test_invalid_inputs():
    with pytest.raises(ValueError, match="window.*0"):
        CapabilityTracker(["a"], window=0)
    tracker = CapabilityTracker(["a"])
    with pytest.raises(ValueError, match="differ in length"):
        tracker.update([1, 0], ["a"])
    with pytest.raises(ValueError, match="nan"):
        tracker.update([float("nan")], ["a"])
