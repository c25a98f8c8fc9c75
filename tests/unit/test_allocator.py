"""The coordinator's ServerApp keeps freed memory for the next round (`hacfed.server.allocator`)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from hacfed.server import allocator

# A round's deliveries in small: 48 blocks of 4 MiB built, freed, built again; the minor page
# faults of the second build are what the setting saves (each fresh page faults once).
_ROUNDS = textwrap.dedent("""
    import resource, sys
    from hacfed.server.allocator import keep_freed_memory
    if sys.argv[1] == "keep":
        assert keep_freed_memory()
    piece = b"x" * 4096
    def build():
        return [piece * 1024 for _ in range(48)]
    blocks = build()
    del blocks
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = build()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
""")
PAGES = 48 * 1024  # 4 KiB pages in the second build


def _second_build_faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", _ROUNDS, mode], capture_output=True, text=True, timeout=120, check=True)
    return int(out.stdout.strip())


@pytest.mark.skipif(allocator._glibc() is None, reason="the C library is not glibc: nothing is set")
def test_memory_freed_by_one_round_is_reused_by_the_next_without_faulting_it_in_again() -> None:
    default, kept = _second_build_faults("default"), _second_build_faults("keep")
    if default < PAGES // 2:
        pytest.skip(f"this glibc keeps freed memory by default ({default} faults for {PAGES} pages)")
    assert kept < PAGES // 20, (default, kept)  # measured: ~49,000 with the defaults, under 100 kept


def test_where_the_c_library_is_not_glibc_nothing_is_set(monkeypatch) -> None:
    monkeypatch.setattr(allocator, "_glibc", lambda: None)
    assert allocator.keep_freed_memory() is False
