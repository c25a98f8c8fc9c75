"""The participant's relay service listens on a Unix socket only the lab's user can open.

On a shared host any local user can connect to a loopback TCP port; a 0600 socket in a 0700
directory is refused by the kernel to every other uid (docs/security.md, "Listeners and sinks").
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import stat
import tempfile
from pathlib import Path

import pytest
from flwr.app import ConfigRecord, RecordDict

from hacfed.clients.local_socket import MAX_UNIX_PATH_BYTES, relay_socket_place
from hacfed.clients.relay import call_participant, relay_content, serve_participant_unix

NOBODY = 65534


def _tcp_listening_inodes() -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A":  # TCP_LISTEN
                inodes.add(fields[9])
    return inodes


def _my_socket_inodes() -> set[str]:
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    return inodes


def _my_tcp_listeners() -> set[str]:
    return _my_socket_inodes() & _tcp_listening_inodes()


def test_the_relay_serves_a_0600_unix_socket_in_a_0700_dir_and_opens_no_tcp_port(tmp_path: Path) -> None:
    place = relay_socket_place(tmp_path / "lab-a")
    assert place.fallback_dir is None and place.note() is None
    assert place.path.parent == tmp_path / "lab-a" / "sockets"
    listeners_before = _my_tcp_listeners()
    server = serve_participant_unix(lambda request: b"echo:" + request, place.path)
    try:
        info = os.lstat(place.path)
        assert stat.S_ISSOCK(info.st_mode)
        assert stat.S_IMODE(info.st_mode) == 0o600
        assert info.st_uid == os.geteuid()
        assert stat.S_IMODE(os.stat(place.path.parent).st_mode) == 0o700
        assert _my_tcp_listeners() == listeners_before, "serving the relay opened a TCP port"
        assert place.address == f"unix:{place.path}"
        assert call_participant(place.address, b"hi", timeout_s=10.0) == b"echo:hi"
        node_config = {"participant-id": "lab-a", "participant-address": place.address}
        content = RecordDict({"hacfed": ConfigRecord({"payload": b"x"})})
        reply = relay_content(content, node_config, {"relay-timeout-s": 10.0})
        assert reply["hacfed"]["payload"] == b"echo:x"
    finally:
        server.stop(0).wait()
    assert not place.path.exists(), "gRPC removes the socket file when the server stops"


def _connect_as(path: Path, uid: int | None) -> str:
    """Fork, drop to `uid` (None: stay), connect to `path`; the child's verdict."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 3
        try:
            if uid is not None:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.connect(str(path))
            code = 0
        except PermissionError:
            code = 1
        except OSError as exc:
            code = 2 if exc.errno == errno.ECONNREFUSED else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return {0: "connected", 1: "permission denied", 2: "refused"}.get(os.waitstatus_to_exitcode(status), "other")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a child as another uid (nobody)")
def test_another_uid_cannot_connect_to_the_relay() -> None:
    base = Path(tempfile.mkdtemp(prefix="hacfed-test-"))  # not tmp_path: its parents are closed to nobody
    try:
        os.chmod(base, 0o755)  # the lab's state dir may be readable by others: the socket dir is what closes
        place = relay_socket_place(base / "lab-a")
        os.chmod(base / "lab-a", 0o755)
        server = serve_participant_unix(lambda request: request, place.path)
        try:
            assert _connect_as(place.path, None) == "connected"
            assert _connect_as(place.path, NOBODY) == "permission denied"
            # the control: with the socket dir and the socket opened up, the same child gets in,
            # so the refusal above is the permissions' doing
            os.chmod(place.path.parent, 0o755)
            os.chmod(place.path, 0o666)
            assert _connect_as(place.path, NOBODY) == "connected"
        finally:
            server.stop(0).wait()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_state_dir_too_long_for_a_socket_falls_back_to_a_private_dir_and_says_so(tmp_path: Path) -> None:
    state = tmp_path / ("d" * 60) / ("e" * 60)
    place = relay_socket_place(state)
    try:
        assert place.fallback_dir is not None
        assert not str(place.path).startswith(str(state))
        assert len(os.fsencode(str(place.path))) <= MAX_UNIX_PATH_BYTES
        assert stat.S_IMODE(os.stat(place.fallback_dir).st_mode) == 0o700
        assert str(place.fallback_dir) in (place.note() or "")
        server = serve_participant_unix(lambda request: request, place.path)
        try:
            assert call_participant(place.address, b"ok", timeout_s=10.0) == b"ok"
            assert stat.S_IMODE(os.lstat(place.path).st_mode) == 0o600
        finally:
            server.stop(0).wait()
    finally:
        place.cleanup()
    assert not place.fallback_dir.exists()


def test_a_socket_dir_open_to_others_is_closed_or_refused(tmp_path: Path) -> None:
    loose = tmp_path / "lab-a" / "sockets"
    loose.mkdir(parents=True, mode=0o755)
    os.chmod(loose, 0o755)
    place = relay_socket_place(tmp_path / "lab-a")
    assert stat.S_IMODE(os.stat(loose).st_mode) == 0o700, "an existing socket dir is closed to others"
    os.chmod(loose, 0o750)
    with pytest.raises(ValueError, match="0700"):
        serve_participant_unix(lambda request: request, place.path)


def test_a_relative_unix_address_is_a_config_error() -> None:
    content = RecordDict({"hacfed": ConfigRecord({"payload": b"x"})})
    reply = relay_content(content, {"participant-address": "unix:relay.sock"}, {"relay-timeout-s": 1.0})
    assert reply["hacfed"]["error"].startswith("HACFED-E-RELAY-CONFIG")


def test_this_flwr_takes_no_unix_address_for_the_clientappio_api() -> None:
    """Why the ClientAppIo API stays on loopback TCP: flwr parses it as HOST:PORT and exits on
    anything else. If an upgrade accepts `unix:` addresses, move it next to the relay socket."""
    from flwr.supercore.address import is_port_in_use, parse_address

    assert parse_address("unix:/run/hacfed/clientappio.sock") is None
    assert is_port_in_use("unix:/run/hacfed/clientappio.sock") is True  # generic_create_grpc_server then exits
