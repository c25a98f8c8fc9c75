"""Flower's gRPC message cap is hacfed's (issue 9, reproduction 7: "Flower's transport still accepts 2 GiB
messages before hacfed's 16 MiB check"; security.md T8, S5).

flwr 1.32 has no option for it, so hacfed lowers the module global its Fleet API server and its
SuperNode connection read (`hacfed.flower_protocol.cap_flower_messages`). These tests pin that
mechanism to this flwr and fail when an upgrade moves it. The running proof (a 17 MiB message
refused by a real SuperLink before anything reads it) is in
tests/integration/test_coordinator_exposure.py.
"""

from __future__ import annotations

import inspect
import types

import pytest

from hacfed.flower_protocol import FLOWER_DEFAULT_MAX_MESSAGE_BYTES, FLOWER_MAX_MESSAGE_BYTES, cap_flower_messages
from hacfed.wire import MAX_MESSAGE_BYTES


def test_the_cap_is_hacfeds_plus_room_for_one_flower_record() -> None:
    assert MAX_MESSAGE_BYTES < FLOWER_MAX_MESSAGE_BYTES <= MAX_MESSAGE_BYTES + 1024 * 1024
    assert FLOWER_MAX_MESSAGE_BYTES < 17 * 1024 * 1024


@pytest.mark.parametrize(("module_name", "reader_name"), [
    ("flwr.server.app", "_run_fleet_api_grpc_rere"),  # the SuperLink's Fleet API server
    ("flwr.supernode.start_client_internal", "_init_connection"),  # a SuperNode's connection to it
])
def test_capping_sets_what_flwrs_fleet_server_and_supernode_read(module_name: str, reader_name: str) -> None:
    module = __import__(module_name, fromlist=["_"])
    reader = getattr(module, reader_name)
    assert "GRPC_MAX_MESSAGE_LENGTH" in inspect.getsource(reader)
    try:
        cap_flower_messages(module, [reader], FLOWER_MAX_MESSAGE_BYTES)
        assert module.GRPC_MAX_MESSAGE_LENGTH == FLOWER_MAX_MESSAGE_BYTES
    finally:
        module.GRPC_MAX_MESSAGE_LENGTH = FLOWER_DEFAULT_MAX_MESSAGE_BYTES


def test_the_supernode_connection_passes_the_cap_to_its_channel() -> None:
    from flwr.client.grpc_rere_client.connection import grpc_request_response

    assert "max_message_length=max_message_length" in inspect.getsource(grpc_request_response)


def test_the_fleet_server_passes_the_cap_to_grpc() -> None:
    from flwr.server.app import _run_fleet_api_grpc_rere
    from flwr.supercore.grpc import generic_create_grpc_server

    assert "max_message_length=GRPC_MAX_MESSAGE_LENGTH" in inspect.getsource(_run_fleet_api_grpc_rere)
    assert '("grpc.max_receive_message_length", max_message_length)' in inspect.getsource(generic_create_grpc_server)


def test_a_flower_that_no_longer_reads_the_global_fails_loudly() -> None:
    module = types.ModuleType("fake_flwr")
    module.GRPC_MAX_MESSAGE_LENGTH = FLOWER_DEFAULT_MAX_MESSAGE_BYTES  # type: ignore[attr-defined]

    def builds_a_server_with_a_literal() -> int:
        return 2_147_483_647

    with pytest.raises(RuntimeError, match="no longer reads GRPC_MAX_MESSAGE_LENGTH"):
        cap_flower_messages(module, [builds_a_server_with_a_literal], FLOWER_MAX_MESSAGE_BYTES)
    del module.GRPC_MAX_MESSAGE_LENGTH
    with pytest.raises(RuntimeError, match="not Flower's 2 GiB default"):
        cap_flower_messages(module, [], FLOWER_MAX_MESSAGE_BYTES)


def test_both_sides_start_flower_through_the_capping_wrappers(tmp_path) -> None:  # noqa: ANN001
    from pathlib import Path

    from hacfed.server.superlink import superlink_argv

    argv = superlink_argv(host="127.0.0.1", fleet_port=0, control_port=0, serverappio_port=0, tls=None,
                          database=Path("db"))
    assert argv[1:5] == ["-m", "hacfed.server.superlink", "capped-superlink", str(FLOWER_MAX_MESSAGE_BYTES)]
    source = inspect.getsource(__import__("hacfed.clients.supernode", fromlist=["_"]).start_supernode)
    assert '"hacfed-supernode"' in source and "str(FLOWER_MAX_MESSAGE_BYTES)" in source
