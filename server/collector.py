"""The coordinator's ServerApp collects garbage rarely, and never walks what it built at startup.

Runs in the coordinator's ServerApp process only (`hacfed.server.driver.make_driver`, and the
bench that mirrors it, bench/coordinator_scale.py), after the driver is built.
"""

from __future__ import annotations

import gc

GC_THRESHOLDS = (10_000, 10, 10)  # the ServerApp's garbage collector (`freeze_startup_objects`)


def freeze_startup_objects() -> None:
    """Move everything allocated so far (modules, the task's problems, the journal's caches) out of
    the garbage collector's generations: each round allocates ~labs x 1,000 samples, and every full
    collection would walk the startup objects again (bench/coordinator_scale.py: 0.1-0.4 s of GC per
    round at 16 labs, ~0.1 s after the freeze). Nothing frozen here is garbage.

    Then collect less often (GC_THRESHOLDS; Python's default is 700, 10, 10): a 64-lab round
    allocates a few million containers, nearly all freed by reference counting or kept for the
    next pool, and with the default the collector ran ~760 times per round, 4-5 of them over the
    whole heap: 0.45-0.65 s of a ~4.7 s round (bench/coordinator_scale.py, timed with
    gc.callbacks). A young generation of 10,000 only holds unreachable cycles a little longer."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
