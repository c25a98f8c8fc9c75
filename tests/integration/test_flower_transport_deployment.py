"""Flower transport, a real deployment: a SuperLink, SuperNodes and `flwr run` started as processes
on loopback, with echo participants served from this process and `EchoDriver`
(tests.integration.flower_transport_helpers) as the ServerApp's driver.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.flower_transport_helpers import (
    REPO_ROOT,
    echo_participants,
    read_rounds,
    run_config,
    running_descendants,
    write_tls_files,
)

HELLO_DOWN = r"hello to node \d+ failed: 'HACFED-E-PARTICIPANT-UNREACHABLE: 127\.0\.0\.1:1"


def test_fast_poll_shim_still_matches_this_flwr() -> None:
    """`start_supernode(idle_poll_s=...)` patches the 3 s sleep of flwr 1.32's SuperNode loop."""
    import inspect

    import flwr.supernode.start_client_internal as loop_module

    assert "time.sleep(3)" in inspect.getsource(loop_module.start_client_internal)
    assert loop_module.time is time


@pytest.mark.slow
def test_two_rounds_over_real_superlink_and_supernodes(tmp_path: Path) -> None:
    from hacfed.clients.supernode import start_supernode
    from hacfed.procs import ProcessSupervisor, flower_env
    from hacfed.server.superlink import start_superlink, submit_run, wait_for_run

    before = running_descendants()
    pad = 6 * 1024 * 1024
    with echo_participants(["lab-a", "lab-b"]) as (ports, sizes), ProcessSupervisor(grace_s=10.0) as sup:
        link = start_superlink(sup, tmp_path / "superlink", extra_env={"PYTHONPATH": str(REPO_ROOT)})
        addresses = {name: f"127.0.0.1:{port}" for name, port in ports.items()}
        addresses["lab-down"] = "127.0.0.1:1"  # nothing listens there: the relay must say so
        # lab-a/lab-b poll every 0.5 s (hacfed's shim) with hacfed's resident ClientApp runner; lab-down runs
        # the stock flower-supernode: Flower's sleeps and a fresh flwr-clientapp per message.
        nodes = {
            name: start_supernode(sup, tmp_path / name, superlink_address=link.fleet_address,
                                  node_config={"participant-id": name, "participant-address": address},
                                  idle_poll_s=None if name == "lab-down" else 0.5,
                                  isolation="subprocess" if name == "lab-down" else "runner")
            for name, address in addresses.items()
        }
        release = tmp_path / "release"
        run = submit_run(sup, tmp_path / "cli", control_address=link.control_address,
                         run_config=run_config(tmp_path / "driver", rounds=2, participants=2, pad=pad,
                                                hold_until=str(release)))
        # lab-down (stock Flower, a fresh flwr-clientapp) may answer its hello after the fast labs finished
        # both rounds: the run is held open until the ServerApp has logged that failed hello.
        deadline = time.monotonic() + 300
        log = run.process.log_path
        while time.monotonic() < deadline and not (log.exists() and re.search(HELLO_DOWN, log.read_text("utf-8"))):
            time.sleep(0.5)
        release.touch()
        run_id, status = wait_for_run(run, timeout_s=300)
        stream = run.process.log_path.read_text(encoding="utf-8")
        # A second run on the same deployment whose driver cannot be built fails visibly
        # (submitted without streaming: its status is polled instead).
        bad = submit_run(sup, tmp_path / "cli-bad", control_address=link.control_address, stream=False,
                         run_config=run_config(tmp_path / "driver-bad", driver="no_such_factory"))
        bad_id, bad_status = wait_for_run(bad, timeout_s=300, poll_s=2.0)
        bad_logs = subprocess.run(["flwr", "log", str(bad_id), bad.connection, "--show"], capture_output=True,
                                  text=True, timeout=120, env=flower_env(bad.flwr_home), check=True).stdout
        during = running_descendants()

    assert status == "finished:completed", stream[-4000:]
    rounds = read_rounds(tmp_path / "driver")
    assert [r["round"] for r in rounds] == [1, 2]
    for r, payload_size in zip(rounds, (len("round-1-lab-a|"), pad), strict=True):
        results = r["results"]
        assert set(results) == {"lab-a", "lab-b"}  # lab-down's participant never answered its hello
        for name in ("lab-a", "lab-b"):
            assert results[name]["ok"] is True, results[name]
            assert results[name]["head"].startswith(f"{name}:")
            assert results[name]["bytes"] == len(name) + 1 + payload_size
    assert re.search(HELLO_DOWN, stream), stream
    assert sizes == {"lab-a": [len("hello"), len("round-1-lab-a|"), pad],
                     "lab-b": [len("hello"), len("round-1-lab-b|"), pad]}
    # lab-a/lab-b ran every message (hello + 2 rounds) in their SuperNode's runner thread, no flwr-clientapp;
    # lab-down's one hello went through stock Flower's flwr-clientapp.
    for name in ("lab-a", "lab-b"):
        node_log = (tmp_path / name / "supernode.log").read_text(encoding="utf-8")
        assert len(re.findall(r"hacfed ClientApp runner: task \d+ \(\S+\) done", node_log)) == 3, node_log[-3000:]
        assert "flwr-clientapp" not in node_log
    down_log = (tmp_path / "lab-down" / "supernode.log").read_text(encoding="utf-8")
    assert "flwr-clientapp" in down_log and "hacfed ClientApp runner" not in down_log
    # Every relay (in the runner thread or a flwr-clientapp process) reported torch not loaded.
    relay_lines = re.findall(r"exchange \S+: node \d+ \((lab-[a-z]+)\) .*relay torch loaded: (\w+)", stream)
    assert sorted(name for name, _ in relay_lines) == sorted(["lab-a", "lab-b"] * 2)
    assert {flag for _, flag in relay_lines} == {"False"}
    assert len({n.node_id for n in nodes.values()}) == 3
    assert bad_status == "finished:failed"
    assert "'no_such_factory' is not a callable" in bad_logs
    assert during - before  # the deployment really ran as children of this process...
    assert running_descendants() - before == set()  # ...and nothing of it is left
    print(f"\nrun {run_id}: seconds per round {[r['seconds'] for r in rounds]}, per node "
          f"{[{n: v['seconds'] for n, v in r['results'].items()} for r in rounds]}")



@pytest.mark.slow
def test_one_round_over_tls(tmp_path: Path) -> None:
    from hacfed.clients.supernode import start_supernode
    from hacfed.procs import ProcessSupervisor
    from hacfed.server.superlink import TlsFiles, start_superlink, submit_run, wait_for_run

    ca, cert, key = write_tls_files(tmp_path / "tls")
    with echo_participants(["lab-a"]) as (ports, sizes), ProcessSupervisor(grace_s=10.0) as sup:
        link = start_superlink(sup, tmp_path / "superlink", insecure=False,
                                             tls=TlsFiles(certfile=cert, keyfile=key, ca_certfile=ca),
                                             extra_env={"PYTHONPATH": str(REPO_ROOT)})
        start_supernode(sup, tmp_path / "lab-a", superlink_address=link.fleet_address, insecure=False,
                        root_cert=ca, idle_poll_s=0.5,
                        node_config={"participant-id": "lab-a", "participant-address": f"127.0.0.1:{ports['lab-a']}"})
        run = submit_run(sup, tmp_path / "cli", control_address=link.control_address, insecure=False,
                         root_cert=ca, run_config=run_config(tmp_path / "driver", rounds=1, participants=1, pad=0))
        _, status = wait_for_run(run, timeout_s=300)
        superlink_log = link.process.log_tail(20000)
    assert status == "finished:completed", run.process.log_tail()
    assert "--insecure" not in link.process.argv
    assert "insecure" not in superlink_log.lower()  # flwr warns loudly whenever TLS is off
    [only_round] = read_rounds(tmp_path / "driver")
    assert only_round["results"]["lab-a"]["ok"] is True
    assert sizes == {"lab-a": [len("hello"), len("round-1-lab-a|")]}
