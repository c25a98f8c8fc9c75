"""The coordinator's ServerApp process: nothing on the server side (nor the ClientApp relay) loads
torch, and the ServerApp's garbage collector runs rarely (`hacfed.server.collector`)."""

from __future__ import annotations

import subprocess
import sys


def test_server_side_and_clientapp_relay_do_not_import_torch() -> None:
    # Every module under server/ (ServerApp, driver, hacfed-server, ...) and the ClientApp relay,
    # which runs in a fresh process per message, imported in a fresh interpreter.
    code = ("import importlib, pkgutil, sys, hacfed.server\n"
            "names = [m.name for m in pkgutil.walk_packages(hacfed.server.__path__, 'hacfed.server.')]\n"
            "assert {'hacfed.server.driver', 'hacfed.server.main', 'hacfed.server.serverapp'} <= set(names), names\n"
            "for name in [*names, 'hacfed.clients.clientapp']:\n"
            "    importlib.import_module(name)\n"
            "sys.exit(1 if 'torch' in sys.modules or 'transformers' in sys.modules else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-2000:]


def test_the_serverapp_collects_garbage_less_often() -> None:
    """`freeze_startup_objects` (make_driver, the bench) sets GC_THRESHOLDS: with Python's default
    the collector took 0.45-0.65 s of a 64-lab round (bench/coordinator_scale.py)."""
    import gc

    from hacfed.server.collector import GC_THRESHOLDS, freeze_startup_objects

    before = gc.get_threshold()
    try:
        freeze_startup_objects()
        assert gc.get_threshold() == GC_THRESHOLDS and GC_THRESHOLDS[0] > 700  # Python's default
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
