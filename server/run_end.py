"""The end of a federation run: collecting every lab's final report and acknowledging it.

Runs in the coordinator's ServerApp process: a part of `hacfed.server.driver.FederationDriver`
(mixed in), which owns the coordinator, the journal, the sends and the console.

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

from hacfed.envelope import DOMAIN_UPDATE, seal
from hacfed.keys import FINAL_ACK_TYPE
from hacfed.server.driver_settings import DONE_FILE
from hacfed.server.replies import ACK, FINAL
from hacfed.server.reporting import append_rows, final_row, rounds_written

# How long a lab owed an acknowledgement that is not connected may keep the run waiting: a lab's
# SuperNode waits at most 30 s between reconnect attempts (`hacfed.clients.backoff.MAX_DELAY_S`),
# and reconnecting, answering the hello and pulling the ack take a few seconds more.
ACK_GRACE_S = 45.0


class RunEnd:
    """The final-report half of `FederationDriver` (see the module docstring)."""

    def _final_reports(self) -> dict[str, dict]:
        stats = self.journal.round_stats(self.cfg.rounds)
        return {pid: s["report"] for pid, s in stats.items() if s.get("report") is not None}

    def _final_payloads(self, admitted: set[str]) -> dict[int, bytes]:
        if self._final_since is None:
            self._final_since = self._monotonic()
        reported = set(self._final_reports())
        quarantined = {p.participant_id for p in self.coordinator.participants() if p.quarantined}
        # a quarantined lab may leave too, connected now or not (waited for ACK_GRACE_S)
        self._acks |= {pid for pid in quarantined if self.membership.known(pid)} - self._acked
        busy = {s.participant_id for s in self._sent.values()}
        acks = {node: pid for node, pid in self._nodes.items()
                if pid in self._acks and pid not in busy and pid not in self._acked}
        self._acked |= set(acks.values())
        payloads = self._send(acks, ACK, seal(self.cfg.run_id.encode(), FINAL_ACK_TYPE, self._key, DOMAIN_UPDATE))
        targets = self._targets(admitted, lambda pid: pid in reported)
        if targets:
            payloads.update(self._send(targets, FINAL, self._sealed_update(self.cfg.rounds)))
        if not payloads:
            self._maybe_finish()
        return payloads

    def _maybe_finish(self) -> None:
        """Done once every active participant reported and got its ack, or one deadline after the
        last round; a lab owed an ack that is not connected is waited for ACK_GRACE_S."""
        reports = self._final_reports()
        active = {p.participant_id for p in self.coordinator.participants() if not p.quarantined}
        waited = self._monotonic() - (self._final_since or self._monotonic())
        if waited >= ACK_GRACE_S:
            self._acks &= set(self._nodes.values())
        if waited < self.cfg.round_deadline_s and not (active <= set(reports) and not self._acks):
            return
        _, final_written = rounds_written(self.metrics_out)
        if not final_written:
            mode, seed = self.cfg.hacpo.mode, self.cfg.seed
            append_rows(self.metrics_out, [final_row(pid, self.cfg.rounds, mode, seed, r) for pid, r in sorted(reports.items())])
        missing = sorted(active - set(reports))
        self._write_status()
        done = {"rounds": self.cfg.rounds, "final_reports": sorted(reports), "missing_final_reports": missing,
                "torch_loaded": "torch" in sys.modules}
        (self.state_dir / DONE_FILE).write_text(json.dumps(done, sort_keys=True) + "\n", encoding="utf-8")
        self._done = True
        self.console(f"federation finished: {self.cfg.rounds} rounds, final reports from {sorted(reports)}"
                     f"{f', none from {missing}' if missing else ''}; torch loaded in the ServerApp: "
                     f"{'torch' in sys.modules}")
