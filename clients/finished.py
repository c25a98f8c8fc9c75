"""Has this lab already finished its run? Read from its outbox before anything starts.

A lab's state dir belongs to one run (`hacfed.clients.service` binds it at the first update), and
the run is over for the lab once the coordinator acknowledged its final report: the outbox then
holds that report (the entry whose plan round is None) as `acked`. Started again after that, the
coordinator has closed the run (and hacfed-server has usually exited), so the SuperNode would only
retry "unreachable" forever; hacfed-client says so in one line and exits instead.
"""

from __future__ import annotations

from pathlib import Path

from hacfed.clients.outbox import Outbox
from hacfed.clients.service import OUTBOX_FILE

SERVICE_DIR = "service"  # hacfed.clients.runner's ParticipantService state dir, under the lab's


def finished_run(state_dir: Path) -> str | None:
    """The id of the run whose final report the coordinator acknowledged to this lab, or None."""
    path = Path(state_dir) / SERVICE_DIR / OUTBOX_FILE
    if not path.is_file():
        return None
    outbox = Outbox(path)
    try:
        done = [e.key[0] for e in outbox.entries() if e.key[2] is None and e.state == "acked"]
    finally:
        outbox.close()
    return done[-1] if done else None
