"""The hello that proves which registered lab a Flower node is, and the notice to one that is not.

Runs in the coordinator's ServerApp process, owned by `hacfed.server.driver.FederationDriver`. The
ServerApp's round loop sends every new node a hello: a fresh challenge signed by the coordinator
(`hello`). The node answers with its participant id and a proof signed with that lab's key, checked
by `Membership.identify` (`identify`). A node whose hello claimed an id that is not registered is
told so with its next hello (HACFED-E-UNKNOWN-PARTICIPANT, at most every NOTICE_INTERVAL_S), since
it is sent nothing else.
"""

from __future__ import annotations

from collections.abc import Callable

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from hacfed.envelope import DOMAIN_UPDATE, seal
from hacfed.exchange import seal_delivery
from hacfed.hello import HELLO_REQUEST_TYPE, hello_challenge
from hacfed.server.answers import AnswerQueue
from hacfed.server.coordinator.errors import ErrorCode
from hacfed.server.membership import NOT_REGISTERED, Membership
from hacfed.wire import WireError

NOTICE_INTERVAL_S = 30.0  # at most how often a node whose id is not registered is told so


class Hellos:
    """The challenges sent to nodes and the unregistered ids their hellos claimed."""

    def __init__(
        self, key: Ed25519PrivateKey, run_id: str, membership: Membership, monotonic: Callable[[], float],
    ) -> None:
        self._key = key
        self._run_id = run_id
        self._membership = membership
        self._monotonic = monotonic
        self._challenges: dict[int, bytes] = {}  # node id -> the challenge of its last hello
        self._unregistered: dict[int, str] = {}  # node id -> the unregistered id its hello claimed
        self._noticed: dict[str, float] = {}  # unregistered participant -> when it was last told

    def hello(self, node_id: int) -> bytes:
        """The payload of a hello to `node_id`: a fresh challenge, signed by the coordinator. A node
        refused before because its id is not registered gets the challenge inside a delivery that also
        tells it so (HACFED-E-UNKNOWN-PARTICIPANT), at most every NOTICE_INTERVAL_S."""
        challenge = hello_challenge(self._run_id, node_id)
        self._challenges[node_id] = challenge
        request = seal(challenge, HELLO_REQUEST_TYPE, self._key, DOMAIN_UPDATE)
        pid, now = self._unregistered.get(node_id), self._monotonic()
        if pid is None or now < self._noticed.get(pid, -NOTICE_INTERVAL_S) + NOTICE_INTERVAL_S:
            return request
        notice = self._unknown_notice(pid)
        if notice is None:
            return request
        self._noticed[pid] = now
        return seal_delivery([notice], request, self._key)

    def identify(self, node_id: int, participant_id: str, proof: bytes) -> bool:
        """True when node `node_id` may be participant `participant_id` (`Membership.identify`)."""
        reason = self._membership.identify(node_id, participant_id, proof, self._challenges.pop(node_id, None))
        if reason == NOT_REGISTERED:
            self._unregistered[node_id] = participant_id  # told so with its next hello
        else:
            self._unregistered.pop(node_id, None)
        return reason is None

    def _unknown_notice(self, pid: str) -> bytes | None:
        """The signed notice telling a node that its participant id is not registered, or None for
        an id that cannot even be encoded (and with trust on first use, where any id may join)."""
        if self._membership.trust_on_first_use:
            return None
        detail = (f"{pid} is not registered with this coordinator: the operator registers a lab with "
                  f"hacfed-server register <its enrolment.txt> (hacfed-client keys prints it)")
        queue = AnswerQueue(self._key, self._run_id)  # not kept: the notice is simply repeated
        try:
            return queue.refusal(pid, ErrorCode.UNKNOWN_PARTICIPANT.value, detail)
        except (WireError, ValueError):
            return None
