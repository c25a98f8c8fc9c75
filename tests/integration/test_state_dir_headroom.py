"""The free-space headroom against a real file system (issue 31; docs/operating.md).

A 4 MiB tmpfs in a mount namespace this test owns (`unshare -m`, root only, as in
test_superlink_disk_full.py): hacfed-server refuses to start in a state dir there with its default
`server.min_free_mib` (512), in one line naming the directory, the free bytes and the setting; and
`shortfall` follows the real free space as a file fills the disk and is removed again (the check the
running coordinator's pause makes). The pause itself is tests/unit/test_headroom.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.processes import BIN, REPO
from tests.unit.test_server_config import BASE

TMPFS = 4 * 1024 * 1024

CHECK = """
import os, sys
from hacfed.server.headroom import shortfall
disk = sys.argv[1]
assert shortfall(disk, 2) is None, shortfall(disk, 2)
with open(os.path.join(disk, "fill"), "wb") as fh:
    fh.write(b"x" * (3 * 1024 * 1024))
print(shortfall(disk, 2))
os.remove(os.path.join(disk, "fill"))
assert shortfall(disk, 2) is None, shortfall(disk, 2)
"""


def test_hacfed_server_refuses_a_state_dir_on_a_nearly_full_disk(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare (a test-owned mount namespace)")
    disk = tmp_path / "disk"
    disk.mkdir()
    config = tmp_path / "coordinator.toml"
    config.write_text(BASE.format(state=disk / "state"))
    script = (f'mount -t tmpfs -o size={TMPFS} tmpfs "$1" || exit 99; "$2" --config "$3"; echo "exit=$?"; '
              f'"$4" -c "$5" "$1"')
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", str(disk),
                           str(BIN / "hacfed-server"), str(config), sys.executable, CHECK],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    if done.returncode == 99:
        pytest.skip(f"mounting a tmpfs in a new mount namespace is not allowed here: {done.stderr}")
    assert done.returncode == 0, done.stderr
    err = done.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"hacfed-server: error: the state dir {disk / 'state'} has "), err
    assert "bytes free" in err[0] and "below server.min_free_mib = 512" in err[0], err
    out = done.stdout.strip().splitlines()
    assert out[0] == "exit=2", out
    assert out[1].startswith(f"the state dir {disk} has ") and "below server.min_free_mib = 2" in out[1], out
