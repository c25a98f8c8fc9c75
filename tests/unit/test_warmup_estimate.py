"""A warm-up's progress is told against an honest estimate of its length, not its step cap: tiny-llama
stops after about 220 steps, and "step 33 of at most 1500" read as a half-hour wait."""

from __future__ import annotations

from hacfed.models.warmup_estimate import estimated_steps, progress_text

# tiny-llama's warm-up (seed 0): (step, teacher-forced held-out screen); it stopped at step 222.
RECORDED = [(10, 0.0), (20, 0.0), (30, 0.005), (40, 0.0), (50, 0.005), (60, 0.01), (70, 0.015), (80, 0.02),
            (90, 0.01), (100, 0.025), (110, 0.015), (120, 0.02), (130, 0.045), (140, 0.02), (150, 0.055),
            (160, 0.065), (170, 0.11), (180, 0.175), (190, 0.22), (192, 0.19), (194, 0.115), (204, 0.175),
            (214, 0.24), (216, 0.32), (218, 0.345), (220, 0.345), (222, 0.355)]
ACTUAL = 222


def test_the_estimate_of_a_recorded_warm_up_stays_within_a_third_of_its_length():
    estimates = [estimated_steps(RECORDED[:i], 0.35, 1500) for i in range(1, len(RECORDED) + 1)]
    assert estimates[:5] == [None] * 5  # before accuracy rises: no guess rather than the cap
    for (step, _), estimate in zip(RECORDED[5:], estimates[5:]):
        assert estimate is not None and ACTUAL * 2 / 3 <= estimate <= ACTUAL * 4 / 3, (step, estimate)
        assert estimate >= step


def test_estimates_are_capped_and_never_behind():
    assert estimated_steps([(10, 0.01), (20, 0.011), (30, 0.012)], 0.35, 300) == 300  # a crawl: the cap
    assert estimated_steps([(10, 0.3), (20, 0.2), (30, 0.1)], 0.35, 500) is None  # falling: no estimate
    assert estimated_steps([(10, 0.1), (20, 0.2), (30, 0.36)], 0.35, 500) == 30  # reached: stops now


def test_the_progress_line_names_the_target_and_the_estimate_not_the_cap():
    line = progress_text(80, RECORDED[:8], 0.35, 1500, fixed_steps=False)
    assert line == "step 80, held-out 0.02 (stops at 0.35), about 177 steps in all"
    assert progress_text(5, [], 0.35, 1500, fixed_steps=False) == \
        "step 5, stops at held-out 0.35, no estimate before accuracy rises"
    assert progress_text(5, [], 0.35, 40, fixed_steps=True) == "step 5 of 40"  # a fixed-length warm-up
