"""The coordinator's ServerApp keeps the memory it frees for the next round (glibc's malloc only).

Runs in the coordinator's ServerApp process only (`hacfed.server.driver.make_driver`), never in a
lab: a lab's trainer allocates through torch, whose memory this must not pin.

Why: at 64 labs a round builds ~384 MB of deliveries (one ~6 MB sealed update per lab), sends
them, and frees them; the next round builds as much again. With glibc's defaults a freed block of
that size goes back to the operating system (it was either mmap()ed, or it sits above the heap's
trim threshold), so every round page-faults its ~100,000 pages in afresh. Copying 384 MB in one
thread took 0.28-0.68 s into fresh memory and 0.03 s into memory kept from the round before; in
bench/coordinator_scale.py at 64 labs the run's minor faults fell 405,000 -> 254,000 and the pool
phase by a few hundredths of a second (docs/results.md, "Coordinator scale"): the deliveries are joined in the
driver's sealing threads, whose malloc arenas glibc still gives back.

What: blocks up to `MMAP_THRESHOLD_BYTES` come from the heap, and up to `TRIM_THRESHOLD_BYTES` of
freed heap is kept. The process's peak memory is unchanged (the next round reuses what the last
one freed); only what it holds between rounds is that peak instead of less.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger("hacfed.server")

M_TRIM_THRESHOLD = -1  # mallopt() parameters, <malloc.h>
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024  # glibc's largest on 64-bit; a delivery is at most 16 MiB
TRIM_THRESHOLD_BYTES = 1024 * 1024 * 1024


def keep_freed_memory() -> bool:
    """Set this process's glibc malloc to keep freed memory (module docstring); True when set,
    False where the C library is not glibc (nothing is changed there)."""
    libc = _glibc()
    if libc is None:
        return False
    mallopt = libc.mallopt
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    kept = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1
    if not kept:
        log.warning("glibc mallopt refused the coordinator's memory settings; freed memory goes back to the system")
    return kept


def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    return libc if hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "mallopt") else None


__all__ = ["keep_freed_memory"]
