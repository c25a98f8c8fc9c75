"""Where the dashboard listens, and the refusal of a public address without an explicit opt-in.

The dashboard shows who takes part, their key fingerprints, strikes and rejection codes: nothing
secret, but nothing to publish either, and it has no authentication. So it binds loopback, and an
operator who wants to see it from elsewhere uses an SSH tunnel
(`ssh -L 8080:127.0.0.1:8080 coordinator-host`, then http://127.0.0.1:8080/ locally). Binding any
other address needs `--dashboard-public`, which says so in the flag's name.
"""

from __future__ import annotations

from dataclasses import dataclass

from hacfed.config_values import split_host_port

LOOPBACK_NAMES = ("localhost",)


def is_loopback_host(host: str) -> bool:
    import ipaddress

    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class DashboardAddress:
    host: str
    port: int
    public: bool  # the operator opted in to a non-loopback address

    @property
    def url_host(self) -> str:
        return f"[{self.host}]" if ":" in self.host else self.host


def parse_dashboard_address(text: str, *, public: bool = False, field: str = "--dashboard") -> DashboardAddress:
    """HOST:PORT (port 0: the OS picks one). A host that is not loopback is refused unless `public`;
    the error says how to opt in and how to tunnel instead."""
    if not isinstance(text, str) or not text:
        raise ValueError(f"{field} must be HOST:PORT, e.g. 127.0.0.1:8080, got {text!r}")
    host, port = split_host_port(text, field)
    if not isinstance(public, bool):
        raise ValueError(f"{field}-public must be true or false, got {public!r}")
    if not is_loopback_host(host) and not public:
        raise ValueError(
            f"{field}: {text!r} is not a loopback address; the dashboard has no authentication, so it binds "
            f"127.0.0.1 / ::1 / localhost unless you also pass --dashboard-public. To view it from another "
            f"machine, prefer an SSH tunnel: ssh -L 8080:127.0.0.1:8080 coordinator-host"
        )
    return DashboardAddress(host, port, public and not is_loopback_host(host))
