"""Values both command lines read from flags and TOML: `--set KEY=VALUE` items, HOST:PORT addresses,
and the argument parser both use (one line per mistake).

Shared by hacfed-server's config (`hacfed.server.config`) and hacfed-client's (`hacfed.clients.config`),
so neither side imports the other's.
"""

from __future__ import annotations

import argparse
import tomllib
from typing import Any


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse with one line per mistake: `prog: error: ... (see prog --help)`, exit 2, no usage dump;
    and no abbreviated flags, so a typo such as `--round 3` is refused instead of read as `--rounds 3`.
    Sub-commands (`add_subparsers().add_parser`) are made with this class too, so they inherit both."""

    def __init__(self, *args: Any, allow_abbrev: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, allow_abbrev=allow_abbrev, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def split_host_port(address: str, field: str) -> tuple[str, int]:
    host, sep, port = str(address).rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{field} must be HOST:PORT with a port in 0-65535, got {address!r}")
    return host, int(port)


def check_port_free(host: str, port: int, field: str) -> None:
    """Refuse a HOST:PORT something already listens on, in one line, before anything is started or
    written (port 0 lets the OS pick: always free). A test bind with SO_REUSEADDR, which on Linux
    fails only when a socket listens there (a port in TIME_WAIT is free to reuse)."""
    import errno
    import socket

    if port == 0:
        return
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                              flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise ValueError(f"{field}: cannot listen on {host}:{port}: {exc.strerror}") from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(sockaddr)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ValueError(f"{field}: port {port} on {host} is in use (another hacfed-server or another "
                                 "program listens there); stop it or choose another port") from None
            raise ValueError(f"{field}: cannot listen on {host}:{port}: {exc.strerror}") from None


def parse_set(item: str) -> tuple[str, Any]:
    """`KEY=VALUE` with VALUE read as a TOML value when it is one (3, 0.5, true, "x", [1, 2]),
    else as a plain string (so `--set run_id=demo` needs no quotes)."""
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        value = text
    return key, value


def describe_os_error(exc: OSError) -> str:
    """One line for a file-system failure, with what to do about the common ones."""
    import errno

    hints = {
        errno.EROFS: "the file system is read-only: give a writable --state-dir",
        errno.EACCES: "permission denied: give a --state-dir this user can write",
        errno.ENOSPC: "the disk is full: free space and run the same command again",
        errno.ENOENT: "no such file or directory",
    }
    where = f" ({exc.filename})" if exc.filename else ""
    return f"{exc.strerror or exc}{where}: {hints.get(exc.errno, 'check the path and its permissions')}"
