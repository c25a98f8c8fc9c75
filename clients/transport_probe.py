"""Does the coordinator speak the transport this lab was told to use? One TLS handshake tells.

Runs in hacfed-client before it starts its SuperNode. A lab started with `--insecure` against a
coordinator with TLS (or with `--tls-ca` against a plaintext one) otherwise only hears that the
coordinator is "not reachable yet": the SuperNode's gRPC channel fails the same way as for a
coordinator that is down.

    hint = transport_mismatch("coord.example.org:9092", insecure=True)   # None, or one line to print
    with TransportWatch(server, insecure, say).watching():               # probed again while it connects
        start_supernode(...)

The probe opens one TCP connection and offers a TLS handshake without checking the certificate (it
only asks which protocol answers; the SuperNode checks the certificate against `--tls-ca`):

- the handshake completes: the coordinator speaks TLS;
- the server answers with bytes that are not TLS (a plaintext gRPC server answers a ClientHello
  with an HTTP/2 GOAWAY frame): it is plaintext;
- no connection, a reset or a timeout: nothing is known (the coordinator may simply be down), so no
  hint.
"""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from hacfed.config_values import split_host_port


def speaks_tls(server: str, timeout_s: float = 3.0) -> bool | None:
    """True: a TLS server answers at HOST:PORT; False: a server that is not TLS; None: unknown."""
    host, port = split_host_port(server, "--server")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # which protocol answers, not whom to trust
    context.set_alpn_protocols(["h2"])
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as raw:
            try:
                with context.wrap_socket(raw, server_hostname=host):
                    return True
            except ssl.SSLError:
                return False
    except OSError:  # refused, reset, unreachable, timed out: the coordinator may be down
        return None


def transport_mismatch(server: str, insecure: bool, timeout_s: float = 3.0) -> str | None:
    """One line saying what to change when the coordinator's transport is not this lab's, else None."""
    tls = speaks_tls(server, timeout_s)
    if tls is True and insecure:
        return (f"the coordinator at {server} speaks TLS but this lab runs plaintext (--insecure): "
                "pass --tls-ca with the federation's ca.pem instead")
    if tls is False and not insecure:
        return (f"the coordinator at {server} is not speaking TLS (a plaintext hacfed-server --insecure?) but "
                "this lab expects TLS (--tls-ca): use the same transport on both sides")
    return None


class TransportWatch:
    """Probes in a thread while the SuperNode connects (`with watch.watching(): start_supernode(...)`):
    a coordinator that was down when the lab started, or that comes up meanwhile, is probed again
    every `interval_s`, and a mismatch is said (`say`) as soon as it is known, not after the
    SuperNode's own retries give up (about 40 s, with Flower's raw log line). Said once per watch."""

    def __init__(self, server: str, insecure: bool, say: Callable[[str], None], interval_s: float = 2.0,
                 probe: Callable[[str, bool], str | None] = transport_mismatch) -> None:
        self.server, self.insecure, self._say = server, insecure, say
        self.interval_s, self._probe = interval_s, probe
        self.said: str | None = None

    @contextmanager
    def watching(self) -> Iterator[None]:
        stop = threading.Event()
        thread = threading.Thread(target=self._run, args=(stop,), name="hacfed-transport-watch", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def check_now(self) -> str | None:
        """Probe once more, now, unless a mismatch was already said; say it if one is found. Called
        when the SuperNode's attempt has failed, so that a mismatch is said before the generic reason
        even when the attempt failed between two of the thread's probes."""
        if self.said is not None:
            return self.said
        mismatch = self._probe(self.server, self.insecure)
        if mismatch is not None:
            self.said = mismatch
            self._say(f"{mismatch}; still trying")
        return mismatch

    def _run(self, stop: threading.Event) -> None:
        while self.said is None and not stop.is_set():
            mismatch = self._probe(self.server, self.insecure)
            if mismatch is not None:
                self.said = mismatch
                self._say(f"{mismatch}; still trying")
                return
            stop.wait(self.interval_s)
