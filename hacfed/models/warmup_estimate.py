"""How far a warm-up is, said honestly: it stops when held-out accuracy reaches its target, usually
long before its step cap (tiny-llama: about 100 steps of at most 1500), so "step 33 of 1500" misleads.

    estimated_steps([(60, 0.01), (70, 0.015), (80, 0.02)], target=0.35, max_steps=1500)   # -> 163
    progress_text(80, screens, target=0.35, max_steps=1500, fixed_steps=False)
    # -> "step 80, held-out 0.02 (stops at 0.35), about 163 steps in all"

Pure functions: `hacfed.models.warmup` shows them on its bar and in its plain progress lines.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def estimated_steps(screens: Sequence[tuple[int, float]], target: float, max_steps: int) -> int | None:
    """About how many steps the warm-up takes in all, from the held-out screens (step, accuracy) so far:
    a least-squares line through log(accuracy) of the screens above zero (a tiny model's accuracy
    grows about exponentially until it nears the target), extended to `target`; at least the latest
    step, at most `max_steps`. None until three screens are above zero and the fit rises.

    On tiny-llama's recorded warm-up (222 steps) it said 177-292 from step 60 on; a straight line
    through the accuracies said 1500 there."""
    points = [(step, math.log(accuracy)) for step, accuracy in screens if accuracy > 0]
    if len(points) < 3:
        return None
    latest_step, latest = screens[-1]
    if latest >= target:
        return latest_step
    n = len(points)
    mean_x, mean_y = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in points)
    if sxx == 0 or sxy <= 0:
        return None
    slope = sxy / sxx
    reach = mean_x + (math.log(target) - mean_y) / slope
    return min(max_steps, max(latest_step, math.ceil(reach)))


def progress_text(step: int, screens: Sequence[tuple[int, float]], target: float, max_steps: int,
                  fixed_steps: bool) -> str:
    """One line on where a warm-up stands, without claiming its step cap as its length."""
    if fixed_steps:
        return f"step {step} of {max_steps}"
    where = f"held-out {screens[-1][1]:.2f} (stops at {target:.2f})" if screens else f"stops at held-out {target:.2f}"
    estimate = estimated_steps(screens, target, max_steps)
    guess = f"about {estimate} steps in all" if estimate is not None else "no estimate before accuracy rises"
    return f"step {step}, {where}, {guess}"
