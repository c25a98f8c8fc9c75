"""A bounded, thread-safe LRU of math-verify verdicts, keyed on the exact request the sandboxed
worker sees (`hacfed.tasks.math_verifier` explains why a cached verdict is safe to reuse)."""

from __future__ import annotations

import threading
from collections import OrderedDict

from hacfed.tasks.base import Verdict

WorkerKey = tuple[str, str]  # (gold, answer) exactly as sent to the worker


class VerdictCache:
    """A bounded LRU map from a worker request (gold, answer) to its Verdict; thread-safe.

    `max_entries` 0 stores nothing. Lookups refresh an entry; a store past the bound evicts the
    least recently used one, so `len` never exceeds `max_entries`."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[WorkerKey, Verdict] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: WorkerKey) -> Verdict | None:
        with self._lock:
            verdict = self._entries.get(key)
            if verdict is not None:
                self._entries.move_to_end(key)
            return verdict

    def put(self, key: WorkerKey, verdict: Verdict) -> None:
        if self.max_entries == 0:
            return
        with self._lock:
            self._entries[key] = verdict
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)
