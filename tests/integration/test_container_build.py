"""Builds deploy/coordinator.Dockerfile with buildah and runs hacfed-server from the image (slow).

Skipped, with the reason, where no container build works: buildah missing, or no base image. A
machine that reaches a registry can use the official python:3.11-slim-bookworm
(HACFED_CONTAINER_BASE=docker.io/library/python:3.11-slim-bookworm); one that reaches only Debian
and PyPI builds a stand-in with deploy/make-base-image.sh (deploy/README.md). Environment:
HACFED_CONTAINER_BASE (default localhost/hacfed-python:3.11-bookworm, which must exist) and
HACFED_BUILDAH_OPTS (global buildah options, default "--storage-driver vfs").

What it checks: the image builds from a context holding only what the Dockerfile copies; torch is
not importable in it; `hacfed-server --help` and `certs init` work; and hacfed-server started from
the image (buildah run, chroot isolation, host network) gets to "ready: Fleet API" with its state
in a bind-mounted folder, prints its coordinator key, and stops cleanly on SIGTERM.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "deploy" / "coordinator.Dockerfile"
BASE = os.environ.get("HACFED_CONTAINER_BASE", "localhost/hacfed-python:3.11-bookworm")
BUILDAH = ["buildah", *shlex.split(os.environ.get("HACFED_BUILDAH_OPTS", "--storage-driver vfs"))]
IMAGE = "localhost/hacfed-coordinator:test"

pytestmark = pytest.mark.slow


def buildah(*args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([*BUILDAH, *args], capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"buildah {' '.join(args)} -> {result.returncode}\n{result.stdout[-3000:]}\n"
                             f"{result.stderr[-3000:]}")
    return result


def copy_sources() -> list[str]:
    """The COPY sources of the Dockerfile (relative to the repository root, the build context)."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    sources = []
    for line in text.splitlines():
        words = line.split()
        if words[:1] == ["COPY"]:
            sources += [w for w in words[1:-1] if not w.startswith("--")]
    return sources


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if shutil.which("buildah") is None:
        pytest.skip("no container runtime: buildah is not installed (apt-get install buildah; deploy/README.md)")
    if buildah("inspect", "--type", "image", BASE, check=False, timeout=120).returncode != 0:
        pytest.skip(f"no base image {BASE}: build it with deploy/make-base-image.sh or set HACFED_CONTAINER_BASE "
                    "(deploy/README.md)")
    context = tmp_path_factory.mktemp("context")
    for source in copy_sources():  # only what the image needs: no .venv, runs/, state or caches
        src, dst = REPO / source, context / source
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, dst)
    (context / "deploy").mkdir(exist_ok=True)
    shutil.copy2(DOCKERFILE, context / "deploy" / DOCKERFILE.name)
    started = time.monotonic()
    buildah("bud", "--isolation", "chroot", "--pull=false", "--build-arg", f"PYTHON_IMAGE={BASE}", "-f",
            str(context / "deploy" / DOCKERFILE.name), "-t", IMAGE, str(context), timeout=1800)
    size = buildah("images", "--format", "{{.Size}}", IMAGE).stdout.strip()
    print(f"coordinator image {IMAGE}: {size} (base {BASE}), built in {time.monotonic() - started:.0f} s")
    yield IMAGE
    buildah("rmi", "-f", IMAGE, check=False)


@pytest.fixture
def container(image: str) -> Iterator[str]:
    name = buildah("from", "--pull=never", image).stdout.strip().splitlines()[-1]
    yield name
    buildah("rm", name, check=False)


def run_in(
    container: str, *argv: str, mounts: tuple[str, ...] = (), timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    volumes = [a for m in mounts for a in ("-v", m)]
    return buildah("run", "--isolation", "chroot", *volumes, container, "--", *argv, timeout=timeout, check=False)


def test_the_image_has_no_torch_and_its_commands_work(container: str) -> None:
    probe = run_in(container, "python", "-c", "import importlib.util as u, sys; "
                   "sys.exit(any(u.find_spec(m) for m in ('torch', 'transformers', 'datasets')))")
    assert probe.returncode == 0, probe.stdout + probe.stderr
    helped = run_in(container, "hacfed-server", "--help")
    assert helped.returncode == 0 and "--tls-cert" in helped.stdout, helped.stdout + helped.stderr
    certs = run_in(container, "hacfed-server", "certs", "init", "--dir", "/tmp/certs", "--hosts", "coordinator")
    assert certs.returncode == 0 and "coordinator" in certs.stdout, certs.stdout + certs.stderr
    user = run_in(container, "id", "-u")
    assert user.stdout.strip() == "10001"


def test_hacfed_server_starts_from_the_image_and_stops_on_sigterm(container: str, tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    os.chmod(state, 0o777)  # the image runs as uid 10001
    log = tmp_path / "server.log"
    argv = [*BUILDAH, "run", "--isolation", "chroot", "-v", f"{state}:/var/lib/hacfed/coordinator", container, "--",
            "hacfed-server", "--config", "/etc/hacfed/coordinator.toml", "--state-dir", "/var/lib/hacfed/coordinator",
            "--insecure", "--listen", "127.0.0.1:0", "--set", "rounds=1", "--set", "round_deadline_s=30"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while not re.search(r"ready: Fleet API on 127\.0\.0\.1:\d+", log.read_text(errors="replace")):
            assert proc.poll() is None, f"hacfed-server exited {proc.returncode}:\n{log.read_text()[-4000:]}"
            assert time.monotonic() < deadline, f"no ready line within 600 s:\n{log.read_text()[-4000:]}"
            time.sleep(0.5)
        text = log.read_text(errors="replace")
        assert "coordinator public key" in text
        assert (state / "coordinator.pub").is_file() and (state / "journal.sqlite").is_file()
    finally:
        stop(proc)
    assert proc.returncode in (0, 130, 143), f"{proc.returncode}:\n{log.read_text()[-4000:]}"
    assert "Traceback" not in log.read_text(errors="replace")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to hacfed-server itself, as `docker stop` would send it (buildah run answers a SIGTERM
    of its own by killing the container): it must stop its SuperLink and exit, and buildah with it."""
    if proc.poll() is not None:
        return
    procs = psutil.Process(proc.pid).children(recursive=True)
    servers = [p for p in procs if _is_server(p) and not _is_server(p.parent())]
    for server in servers:
        server.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert servers, "no hacfed-server process under buildah run"
    alive = [p.pid for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"left running after hacfed-server stopped: {alive}"


def _is_server(p: psutil.Process | None) -> bool:
    try:
        argv = p.cmdline() if p is not None else []
        # the Python process itself, not buildah-chroot-exec, whose argv also names hacfed-server
        return len(argv) > 1 and "python" in Path(argv[0]).name and argv[1].endswith("hacfed-server")
    except psutil.Error:
        return False
