"""Where a lab's local relay socket lives: a Unix socket in a directory only the lab's user can enter.

Runs in hacfed-client. On a shared host (a Slurm node, a lab server) any local user can connect to
a loopback TCP port, so the participant's relay service (`hacfed.clients.relay.serve_participant_unix`)
listens on a Unix socket instead: `STATE/sockets/relay.sock`, the directory 0700 and the socket 0600,
both owned by the lab's user. The kernel then refuses every other uid (root aside) at `connect()`.

    place = relay_socket_place(state_dir)   # RelaySocket(path, fallback_dir or None)
    ...serve on place.address ("unix:/abs/path"), say place.note() when it is not None...
    place.cleanup()                          # removes a fallback directory

A Unix socket path is at most 107 bytes on Linux. When the state dir's path is longer, the socket
goes into a fresh private directory (`tempfile.mkdtemp`, 0700) under `$XDG_RUNTIME_DIR` when that
is a private directory of this user, else under the system temp dir, and `note()` says where; it
never falls back to TCP.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

UNIX_PREFIX = "unix:"
MAX_UNIX_PATH_BYTES = 107  # sockaddr_un.sun_path is 108 bytes on Linux, one for the NUL
SOCKET_DIR = "sockets"
RELAY_SOCKET = "relay.sock"


@dataclass(frozen=True)
class RelaySocket:
    """The relay's socket path; `fallback_dir` is set when it lives outside the state dir."""

    path: Path
    fallback_dir: Path | None = None

    @property
    def address(self) -> str:
        return f"{UNIX_PREFIX}{self.path}"

    def note(self) -> str | None:
        if self.fallback_dir is None:
            return None
        return (f"the state dir's path is too long for a Unix socket ({MAX_UNIX_PATH_BYTES} bytes at most): "
                f"the participant service's socket is in the private directory {self.fallback_dir} instead")

    def cleanup(self) -> None:
        if self.fallback_dir is not None:
            shutil.rmtree(self.fallback_dir, ignore_errors=True)


def private_dir(path: Path) -> Path:
    """Create `path` (0700) or check an existing one: a directory of this user that nobody else may enter."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise ValueError(f"{path} must be a directory for the lab's local sockets, it is not")
    if info.st_uid != os.geteuid():
        raise ValueError(f"{path} belongs to uid {info.st_uid}, not to this user (uid {os.geteuid()}): "
                         f"another user could reach the lab's local sockets")
    if info.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def fits_unix_path(path: Path) -> bool:
    return len(os.fsencode(str(path))) <= MAX_UNIX_PATH_BYTES


def relay_socket_place(state_dir: Path) -> RelaySocket:
    """The relay socket under `state_dir/sockets/` (made private), or in a short private fallback dir."""
    state_dir = Path(state_dir).absolute()
    preferred = state_dir / SOCKET_DIR / RELAY_SOCKET
    if fits_unix_path(preferred):
        private_dir(preferred.parent)
        return RelaySocket(preferred)
    fallback = Path(tempfile.mkdtemp(prefix="hacfed-", dir=_runtime_dir()))  # mkdtemp creates it 0700
    path = fallback / RELAY_SOCKET
    if not fits_unix_path(path):
        shutil.rmtree(fallback, ignore_errors=True)
        raise ValueError(f"no short enough private directory for the relay's Unix socket ({path} is over "
                         f"{MAX_UNIX_PATH_BYTES} bytes): set TMPDIR or XDG_RUNTIME_DIR to a shorter path")
    return RelaySocket(path, fallback)


def _runtime_dir() -> str | None:
    """$XDG_RUNTIME_DIR when it is this user's private directory, else None (the system temp dir)."""
    value = os.environ.get("XDG_RUNTIME_DIR")
    if not value or not os.path.isabs(value):
        return None
    try:
        info = os.stat(value)
    except OSError:
        return None
    if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o077:
        return value
    return None
