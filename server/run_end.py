"""The end of a federation run: collecting every lab's final report and acknowledging it.

Runs in the coordinator's ServerApp process, owned by `hacfed.server.driver.FederationDriver`,
which hands it the coordinator, the journal, the deliveries and the console. `RunEnd` owns who
is owed an acknowledgement, who got one, and whether the run is done.

After the last round closes, every active lab is sent a plan-less update (the last pool): it trains
on it, evaluates, and replies with its final report, recorded in the journal. Each lab that reported
(and each quarantined lab that is still registered) then gets one signed final acknowledgement, after
which its hacfed-client may exit. The run is done, and `DONE_FILE` written, once every active lab
reported and got its acknowledgement, or one round deadline after the last round. A lab owed an
acknowledgement that is not connected (its SuperNode between reconnect attempts, e.g. after a
coordinator restart) is waited for ACK_GRACE_S: longer than a lab's longest reconnect wait, so it
comes back in time and learns that the run is over instead of retrying forever.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from hacfed.envelope import DOMAIN_UPDATE, seal, write_atomic
from hacfed.keys import FINAL_ACK_TYPE
from hacfed.messages import Submission
from hacfed.server.coordinator import Coordinator, Journal
from hacfed.server.coordinator.config import CoordinatorConfig
from hacfed.server.coordinator.validation import Rejection
from hacfed.server.deliveries import ACK, Deliveries
from hacfed.server.driver_settings import DONE_FILE, STATUS_FILE
from hacfed.server.membership import Membership
from hacfed.server.reporting import append_rows, final_row, rounds_written

# How long a lab owed an acknowledgement that is not connected may keep the run waiting: a lab's
# SuperNode waits at most 30 s between reconnect attempts (`hacfed.clients.backoff.MAX_DELAY_S`),
# and reconnecting, answering the hello and pulling the ack take a few seconds more.
ACK_GRACE_S = 45.0


class RunEnd:
    """The final reports and acknowledgements (see the module docstring)."""

    def __init__(
        self, cfg: CoordinatorConfig, coordinator: Coordinator, journal: Journal, membership: Membership,
        deliveries: Deliveries, key: Ed25519PrivateKey, console: Callable[[str], None],
        monotonic: Callable[[], float], metrics_out: Path,
    ) -> None:
        self._cfg = cfg
        self._coordinator = coordinator
        self._journal = journal
        self._membership = membership
        self._deliveries = deliveries
        self._key = key
        self._console = console
        self._monotonic = monotonic
        self._metrics_out = metrics_out
        self._state_dir = Path(cfg.state_dir)
        self._since: float | None = None  # when the last round closed (this process's clock)
        self._acks: set[str] = set()  # the run is over for them; acknowledgement not yet delivered
        self._acked: set[str] = set()  # acknowledgements sent (each participant gets one)
        self.done = (self._state_dir / DONE_FILE).exists()

    def final_reports(self) -> dict[str, dict]:
        stats = self._journal.round_stats(self._cfg.rounds)
        return {pid: s["report"] for pid, s in stats.items() if s.get("report") is not None}

    def start(self) -> None:
        """The last round closed: the final exchange begins now."""
        self._since = self._monotonic()

    def resume(self) -> None:
        """After a restart with every round done: labs that reported before it may still wait for
        their acknowledgement."""
        self._since = self._monotonic()
        self._acks = set(self.final_reports())

    def take_report(self, participant_id: str, submission: Submission) -> Rejection | None:
        """A lab's final report: recorded (a resend of a recorded one changes nothing) and owed its
        acknowledgement; the refusal when the coordinator refused it."""
        if participant_id not in self.final_reports():
            problem = self._coordinator.record_final_report(submission, sender=participant_id)
            if problem is not None:
                return problem
            accuracy = submission.report.eval_accuracy if submission.report else None
            self._console(f"final report {participant_id}: eval {_fmt(accuracy)}")
        self._acks.add(participant_id)  # the final acknowledgement answers it
        return None

    def acknowledged(self, participant_id: str) -> None:
        """The lab has its acknowledgement (or may leave without it: its delivery failed)."""
        self._acks.discard(participant_id)

    def ack_payloads(self, nodes: Mapping[int, str]) -> dict[int, bytes]:
        """The acknowledgements due now, one per lab, to the labs' nodes that are not busy."""
        if self._since is None:
            self._since = self._monotonic()
        quarantined = {p.participant_id for p in self._coordinator.participants() if p.quarantined}
        # a quarantined lab may leave too, connected now or not (waited for ACK_GRACE_S)
        self._acks |= {pid for pid in quarantined if self._membership.known(pid)} - self._acked
        busy = self._deliveries.busy()
        acks = {node: pid for node, pid in nodes.items()
                if pid in self._acks and pid not in busy and pid not in self._acked}
        self._acked |= set(acks.values())
        ack = seal(self._cfg.run_id.encode(), FINAL_ACK_TYPE, self._key, DOMAIN_UPDATE)
        return self._deliveries.send(acks, ACK, ack)

    def maybe_finish(self, nodes: Mapping[int, str]) -> None:
        """Done once every active participant reported and got its ack, or one deadline after the
        last round; a lab owed an ack that is not connected (not in `nodes`) is waited for
        ACK_GRACE_S."""
        reports = self.final_reports()
        active = self._coordinator.awaited()  # neither quarantined nor revoked
        waited = self._monotonic() - (self._since or self._monotonic())
        if waited >= ACK_GRACE_S:
            self._acks &= set(nodes.values())
        if waited < self._cfg.round_deadline_s and not (active <= set(reports) and not self._acks):
            return
        rounds, mode, seed = self._cfg.rounds, self._cfg.hacpo.mode, self._cfg.seed
        _, final_written = rounds_written(self._metrics_out)
        if not final_written:
            rows = [final_row(pid, rounds, mode, seed, r) for pid, r in sorted(reports.items())]
            append_rows(self._metrics_out, rows)
        missing = sorted(active - set(reports))
        write_status(self._state_dir, self._coordinator, self.done)
        done = {"rounds": rounds, "final_reports": sorted(reports), "missing_final_reports": missing,
                "torch_loaded": "torch" in sys.modules}
        write_atomic(self._state_dir / DONE_FILE, (json.dumps(done, sort_keys=True) + "\n").encode("utf-8"), 0o644)
        self.done = True
        self._console(f"federation finished: {rounds} rounds, final reports from {sorted(reports)}"
                      f"{f', none from {missing}' if missing else ''}; torch loaded in the ServerApp: "
                      f"{'torch' in sys.modules}")


def write_status(state_dir: Path, coordinator: Coordinator, done: bool) -> None:
    """`driver-status.json`: where the rounds stand (`open_round`: the newest open round; `open_rounds`:
    every open one, oldest first, up to K + 1 with max_staleness K), and whether torch was ever loaded here.
    Written whole or not at all (`write_atomic`): hacfed-server reads it after a kill -9 of this process."""
    status = {"torch_loaded": "torch" in sys.modules, "next_round": coordinator.next_round_id,
              "open_round": coordinator.current_round, "open_rounds": coordinator.open_rounds(), "done": done}
    write_atomic(state_dir / STATUS_FILE, (json.dumps(status, sort_keys=True) + "\n").encode("utf-8"), 0o644)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
