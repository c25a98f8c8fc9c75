"""Progress bars on a terminal only, never in logs or pipes.

    bars_only_on_a_terminal()   # first thing in hacfed, hacfed-server and hacfed-client

When stderr is not a terminal it sets, for this process and every process it starts,
HF_HUB_DISABLE_PROGRESS_BARS=1 (huggingface_hub, and transformers, which reads it when imported:
"Writing model shards", "Loading weights") and TQDM_DISABLE=1 (tqdm's default for every bar that
does not pass `disable` itself). A value the user already set is left alone. Code that draws its
own bars passes `disable=not sys.stderr.isatty()` (or a `progress` flag computed from it).
"""

from __future__ import annotations

import os
import sys


def bars_only_on_a_terminal() -> bool:
    """True when stderr is a terminal (bars stay on); otherwise switches them off and returns False."""
    if sys.stderr.isatty():
        return True
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")
    return False
