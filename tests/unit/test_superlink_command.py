"""The SuperLink command binds nothing but the Fleet API off loopback (issue 9, reproduction 1).

The slow proof with real processes is tests/integration/test_coordinator_exposure.py; this pins the
command line, and fails when a Flower upgrade adds a server address option hacfed does not set.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hacfed.server.superlink import superlink_argv

# Every `*-address` option of flwr 1.32's `flower-superlink` and what hacfed does with it.
BOUND_TO_LOOPBACK = {"--control-api-address", "--serverappio-api-address"}
LEFT_UNSET = {
    "--exec-api-address",  # deprecated alias of --control-api-address
    "--health-server-address",  # the health server starts only when this is given
}


def _options(argv: list[str]) -> dict[str, str]:
    return {flag: value for flag, value in zip(argv, argv[1:]) if flag.startswith("--") and not value.startswith("--")}


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "coordinator.example", "127.0.0.1"])
def test_only_the_fleet_api_takes_the_listen_host(host: str) -> None:
    options = _options(superlink_argv(host=host, fleet_port=9092, control_port=0, serverappio_port=0, tls=None,
                                      database=Path("db")))
    assert options["--fleet-api-address"] == f"{host}:9092"
    for flag in BOUND_TO_LOOPBACK:
        assert options[flag].startswith("127.0.0.1:"), (flag, options[flag])
    assert not LEFT_UNSET & set(options)


def test_every_server_address_option_of_this_flwr_is_accounted_for() -> None:
    from flwr.server.app import _parse_args_run_superlink

    address_options = {option for action in _parse_args_run_superlink()._actions for option in action.option_strings
                       if option.endswith("-address") and option != "--simulationio-api-address"}
    assert address_options == BOUND_TO_LOOPBACK | LEFT_UNSET | {"--fleet-api-address"}
