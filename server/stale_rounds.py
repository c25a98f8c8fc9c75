"""The round driver's rounds when each lab is at its own step, over Flower.

Runs in the coordinator's ServerApp process, owned by `hacfed.server.driver.FederationDriver` when
the coordinator's engine journals each lab's steps (`RoundEngine.journaled`: `max_staleness` K >= 1,
or `round_join = "newest"` at any K); otherwise the driver sends synchronous rounds and this module is
not used. docs/staleness.md has the schedule: lab l starts step t once its own step t - 1 submission
is in and round t - 1 - K has closed, S_l(t) = max(F_l(t - 1), C(t - 1 - K)); the final update (step
R) waits for round R - 1 to close.

The ServerApp's loop runs each exchange on its own (`RoundLoop`, at every K), so a lab whose
reply was judged is sent its next step at the next poll, while slower labs' exchanges are still out.
Which step a lab is at comes from the journal alone (`RoundEngine.step_of`, or `RoundEngine.next_step`
under round_join "newest"). Round t is opened when the first lab is ready for it, which
`Coordinator.open_round` allows once round t - 1 - K closed; rounds close oldest first by the usual
quorum and deadline rules (the driver's `close_round`). A lab's update is `RoundEngine.update_for`:
its choice of samples is journaled (`Journal.record_sent_step`) before the update is sealed, so a
resend of the same step (a failed exchange, a restarted coordinator) carries the same samples, and
after a kill -9 the labs go on where the journal says.

A lab's update is sealed whole (`encode_round_update`): its selection is the lab's own, so none is
shared between labs as in `hacfed.server.round_updates`. One that would not fit in one message
(`hacfed.wire.MAX_MESSAGE_BYTES`, less `DELIVERY_ROOM` for the delivery around it) is cut as the
synchronous driver cuts its updates, to fewer peers per prompt down to the lab's own samples, before
its choice is journaled (`pool_share.fitted_peers`); the console says so with the number of samples left
out, which that lab is never sent. One whose own samples and plan alone do not fit is sent as it is,
as a synchronous one is: past the message itself it fails to seal.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from hacfed.envelope import DOMAIN_UPDATE, seal
from hacfed.server.coordinator import Coordinator
from hacfed.server.deliveries import FINAL, Deliveries
from hacfed.server.round_updates import DELIVERY_ROOM
from hacfed.wire import MAX_MESSAGE_BYTES, PayloadType, encode_round_update


class StaleRounds:
    """Which step each lab is sent next and its sealed update (module docstring)."""

    def __init__(self, coordinator: Coordinator, key: Ed25519PrivateKey, deliveries: Deliveries,
                 console: Callable[[str], None]) -> None:
        self._coordinator = coordinator
        self._key = key
        self._deliveries = deliveries
        self._console = console
        self._k = coordinator.cfg.max_staleness
        self._rounds = coordinator.cfg.rounds
        self._joining = coordinator.cfg.round_join == "newest"
        self.max_bytes = MAX_MESSAGE_BYTES - DELIVERY_ROOM  # the most bytes a lab's encoded update may take

    def step_of(self, participant_id: str) -> int | None:
        """The step `participant_id` may be sent now, or None while it must wait (`RoundEngine.step_of`, or
        `next_step` under round_join "newest"); the first round opens by the driver's participant rules."""
        engine = self._coordinator.engine
        if self._joining:
            return engine.next_step(participant_id, resend=True)
        return engine.step_of(participant_id)

    def payloads(self, targets: Mapping[int, str]) -> dict[int, bytes]:
        """The deliveries to the labs of `targets` (node id -> participant id, neither busy nor held)
        that may start a step now, opening the round of a step first when it is the next one."""
        by_step: dict[int, dict[int, str]] = {}
        for node, pid in targets.items():
            step = self.step_of(pid)
            if step is not None and step < self._rounds:
                by_step.setdefault(step, {})[node] = pid
        out: dict[int, bytes] = {}
        for step in sorted(by_step):
            if step == self._coordinator.next_round_id:
                self.open(step)
            out.update(self._deliveries.send(by_step[step], step, self.sealer(step)))
        return out

    def final_payloads(self, targets: Mapping[int, str]) -> dict[int, bytes]:
        """The final update (step `rounds`) to each lab of `targets`."""
        return self._deliveries.send(targets, FINAL, self.sealer(self._rounds)) if targets else {}

    def open(self, round_id: int) -> None:
        plan = self._coordinator.open_round(round_id)
        self._deliveries.clear_holds()  # a new round asks every lab again, as in the synchronous driver
        self._console(f"round {plan.round_id} open: {len(plan.prompts)} prompts x G={plan.group_size}"
                      f"{' (+ evaluation)' if plan.evaluate else ''}, deadline "
                      f"{self._coordinator.cfg.round_deadline_s:.0f}s (max_staleness {self._k})")

    def sealer(self, step: int) -> Callable[[str], tuple[bytes, ...]]:
        """participant id -> its sealed update for `step`, as envelope pieces (`Deliveries.send`)."""
        def sealed(pid: str) -> tuple[bytes, ...]:
            built = self._coordinator.engine.update_for(pid, step, self.max_bytes)
            wanted = self._coordinator.cfg.pool_peers_per_prompt
            if built.size is not None and built.peers_per_prompt < wanted:  # its first build was cut to fit
                self._console(f"step {step} update for {pid}: {built.peers_per_prompt} peers per prompt instead of "
                              f"{wanted}, to fit in one message ({built.size} bytes; {self.max_bytes} available): "
                              f"{built.left_out} samples left out, never sent to it; lower pool_peers_per_prompt, "
                              f"max_staleness or max_new_tokens to send every lab everything")
            payload = encode_round_update(built.update)
            return (seal(payload, PayloadType.ROUND_UPDATE, self._key, DOMAIN_UPDATE),)
        return sealed
