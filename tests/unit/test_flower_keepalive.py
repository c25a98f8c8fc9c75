"""Flower's channels and servers get hacfed's keepalive options (hacfed.flower_keepalive; security.md R6).

The partition itself (a lab's link down for 30 s, noticed within keepalive time + timeout) is
tests/faults/test_partition_netns.py.
"""

from __future__ import annotations

import types
from collections.abc import Iterator

import flwr.supercore.grpc as flower_grpc
import grpc
import pytest

from hacfed import flower_keepalive as keepalive
from hacfed.server.superlink import run_capped_superlink


@pytest.fixture
def installed() -> Iterator[None]:
    keepalive.install()
    try:
        yield
    finally:
        keepalive.uninstall()
    assert flower_grpc.grpc is grpc


def test_flowers_channels_get_the_keepalive_options_and_keep_their_own(installed, monkeypatch):
    seen = []
    monkeypatch.setattr(grpc, "insecure_channel", lambda target, options=None, **kw: seen.append(options) or "ch")
    monkeypatch.setattr(grpc, "secure_channel",
                        lambda target, creds, options=None, **kw: seen.append(options) or "ch")
    assert flower_grpc.create_channel("127.0.0.1:1", insecure=True, max_message_length=1234) == "ch"
    assert flower_grpc.create_channel("127.0.0.1:1", insecure=False, root_certificates=None) == "ch"
    for options in seen:
        values = dict(options)
        assert len(values) == len(options)
        assert {k: values[k] for k, _ in keepalive.CHANNEL_OPTIONS} == dict(keepalive.CHANNEL_OPTIONS)
        assert "grpc.max_receive_message_length" in values
    assert dict(seen[0])["grpc.max_send_message_length"] == 1234
    assert dict(keepalive.CHANNEL_OPTIONS)["grpc.keepalive_time_ms"] == keepalive.KEEPALIVE_TIME_MS
    # what gRPC waits for the ping's answer (60 s by default): faults/test_half_open_keepalive.py
    assert dict(keepalive.CHANNEL_OPTIONS)["grpc.http2.ping_timeout_ms"] == keepalive.KEEPALIVE_TIMEOUT_MS


def test_flowers_servers_accept_pings_as_often_as_labs_send_them(installed, monkeypatch):
    seen = []

    class FakeServer:
        def add_insecure_port(self, address):
            return 1

    def server(*args, options=None, **kwargs):
        seen.append(options)
        return FakeServer()

    monkeypatch.setattr(grpc, "server", server)
    flower_grpc.generic_create_grpc_server((object(), lambda servicer, srv: None), "127.0.0.1:0")
    values = dict(seen[0])
    assert values["grpc.keepalive_permit_without_calls"] == 1  # Flower's own 0 is replaced
    assert values["grpc.http2.min_recv_ping_interval_without_data_ms"] <= keepalive.KEEPALIVE_TIME_MS
    assert values["grpc.keepalive_time_ms"] == 210000  # Flower's own pings are left as they are


def test_install_refuses_a_flower_that_builds_its_channels_elsewhere():
    fake = types.ModuleType("fake_flower_grpc")
    fake.grpc = grpc

    def create_channel(address):
        return address

    def generic_create_grpc_server(address):
        return grpc.server(None, options=[])

    fake.create_channel, fake.generic_create_grpc_server = create_channel, generic_create_grpc_server
    with pytest.raises(RuntimeError, match=r"fake_flower_grpc.create_channel no longer builds"):
        keepalive.install(fake)
    assert fake.grpc is grpc


def test_the_supernode_and_superlink_wrappers_install_it():
    import inspect

    from hacfed.clients.supernode import run_supernode

    for wrapper in (run_supernode, run_capped_superlink):
        assert "install_keepalive()" in inspect.getsource(wrapper), wrapper.__qualname__
