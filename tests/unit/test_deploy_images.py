"""The Dockerfiles, the Slurm script and make-secrets.sh under deploy/ agree with hacfed.

Every COPY source exists; every hacfed-server / hacfed-client command line in them parses with the
real argparse parsers; the lab Dockerfile's torch step picks the right index for each variant;
make-secrets.sh, run for real into temp folders, does what compose needs. No container is started.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.unit.deploy_files import (
    BIN,
    DEPLOY,
    REPO,
    check_cli,
    dockerfile_instructions,
    flag_value,
    image_entrypoint,
    shell_hacfed_commands,
)

# ----------------------------------------------------------------------------------------------
# Dockerfiles, Slurm, make-secrets.sh.


@pytest.mark.parametrize("name", ["coordinator.Dockerfile", "lab.Dockerfile"])
def test_dockerfile_copy_sources_exist(name: str) -> None:
    copies = [rest for ins, rest in dockerfile_instructions(DEPLOY / name) if ins == "COPY"]
    assert copies
    for rest in copies:
        words = [w for w in shlex.split(rest) if not w.startswith("--")]
        for source in words[:-1]:
            assert (REPO / source).exists(), f"{name}: COPY {source} (from the repository root) does not exist"
    froms = [rest for ins, rest in dockerfile_instructions(DEPLOY / name) if ins == "FROM"]
    assert froms == ["${PYTHON_IMAGE}"]  # one stage, its base a build argument (make-base-image.sh)


def test_coordinator_dockerfile_installs_no_torch_and_runs_hacfed_server() -> None:
    instructions = dockerfile_instructions(DEPLOY / "coordinator.Dockerfile")
    runs = [rest for ins, rest in instructions if ins == "RUN"]
    installs = [m.strip() for run in runs for m in re.findall(r"pip install ([^&;]*)", run)]
    assert installs == ["-r /tmp/hacfed-src/deploy/coordinator-requirements.txt",
                        "-r /tmp/hacfed-src/deploy/coordinator-data-requirements.txt", "--no-deps /tmp/hacfed-src"]
    assert not any("torch" in i for i in installs)
    [cmd] = [json.loads(rest) for ins, rest in instructions if ins == "CMD"]
    check_cli([*image_entrypoint("coordinator.Dockerfile"), *cmd])
    assert image_entrypoint("coordinator.Dockerfile") == ["hacfed-server"]
    assert dict(instructions)["USER"] == "hacfed"


def test_lab_dockerfile_variants() -> None:
    text = " ".join(rest for ins, rest in dockerfile_instructions(DEPLOY / "lab.Dockerfile") if ins == "RUN")
    args = [rest for ins, rest in dockerfile_instructions(DEPLOY / "lab.Dockerfile") if ins == "ARG"]
    assert {"VARIANT=cpu", "TORCH_VERSION=2.13.0", "TORCH_INDEX_URL=", "EXTRAS="} <= set(args)
    assert "https://download.pytorch.org/whl/cpu" in text and "cuda)" in text and "vllm)" in text
    assert image_entrypoint("lab.Dockerfile") == ["hacfed-client"]
    bootstrap = (REPO / "scripts" / "bootstrap.sh").read_text()
    assert "HACFED_TORCH_VERSION:-2.13.0" in bootstrap  # the same torch as the development install


def test_slurm_script_runs_a_gpu_lab_with_real_flags() -> None:
    script = DEPLOY / "slurm" / "lab.sbatch"
    text = script.read_text()
    directives = dict(re.findall(r"^#SBATCH --([\w-]+)(?:=(\S+))?", text, re.M))
    assert directives["gres"] == "gpu:1" and directives["signal"].startswith("B:TERM@") and "requeue" in directives
    [argv] = shell_hacfed_commands(script)
    check_cli(argv)
    assert flag_value(argv, "--device") == "cuda:0"
    assert "exec " in text  # Slurm's SIGTERM reaches hacfed-client, which keeps its state
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_make_secrets_script_uses_real_flags() -> None:
    commands = shell_hacfed_commands(DEPLOY / "make-secrets.sh")
    assert [c[:3] for c in commands] == [["hacfed-server", "certs", "init"], ["hacfed-client", "keys", "--state-dir"],
                                          ["hacfed-server", "register", "--state-dir"]]
    for argv in commands:
        check_cli(argv)


def test_make_secrets_creates_what_compose_mounts_and_is_idempotent(tmp_path: Path) -> None:
    dirs = {"OPERATOR_DIR": "operator", "CERTS_DIR": "certs", "COORDINATOR_STATE": "coordinator",
            "PUBLIC_DIR": "public", "LAB_ROOT": "labs"}
    env = {**os.environ, **{k: str(tmp_path / v) for k, v in dirs.items()},
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "COORDINATOR_HOSTS": "coordinator"}
    env.pop("OWNER", None)

    def run() -> dict[str, bytes]:
        result = subprocess.run(["sh", str(DEPLOY / "make-secrets.sh")], env=env, capture_output=True, text=True,
                                timeout=600)
        assert result.returncode == 0, result.stdout + result.stderr
        return {str(p.relative_to(tmp_path)): p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()}

    first = run()
    assert {"certs/server.pem", "certs/server.key", "certs/ca.pem", "public/ca.pem", "public/coordinator.pub",
            "coordinator/coordinator.key", "labs/lab-a/lab/participant.key",
            "labs/lab-b/lab/supernode.key"} <= set(first)
    assert [p for p in first if p.endswith("ca.key")] == ["operator/ca.key"]  # the CA key stays with the operator
    assert not any(p.endswith(".key") for p in first if p.startswith("public/"))
    assert first["public/coordinator.pub"] == first["coordinator/coordinator.pub"]
    assert first["public/ca.pem"] == first["certs/ca.pem"] == first["operator/ca.pem"]
    assert (tmp_path / "certs" / "server.key").stat().st_mode & 0o777 == 0o600
    labs = subprocess.run([str(BIN / "hacfed-server"), "labs", "--state-dir", str(tmp_path / "coordinator")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert labs.returncode == 0 and "lab-a" in labs.stdout and "lab-b" in labs.stdout, labs.stdout + labs.stderr
    second = run()
    changed = sorted(p for p in first if first[p] != second.get(p))
    expected = all(p.endswith("enrolment.txt") or p.startswith("coordinator/audit") for p in changed)
    assert changed == [] or expected, changed
    assert {p: v for p, v in second.items() if p.endswith((".key", ".pem", ".pub"))} == \
           {p: v for p, v in first.items() if p.endswith((".key", ".pem", ".pub"))}


def lab_torch_step(**build_args: str) -> subprocess.CompletedProcess[str]:
    """The lab Dockerfile's torch RUN step under sh, with its ARG defaults and `build_args`, and
    `pip` replaced by a function that prints its arguments (nothing is installed)."""
    instructions = dockerfile_instructions(DEPLOY / "lab.Dockerfile")
    [step] = [rest for ins, rest in instructions if ins == "RUN" and "VARIANT" in rest]
    base = "PYTHON_IMAGE=python:3.11-slim-bookworm"
    args = dict(rest.split("=", 1) for ins, rest in instructions if ins == "ARG" and rest != base)
    env = {**os.environ, **args, **build_args}
    return subprocess.run(["sh", "-c", f'pip() {{ echo "pip $*"; }}; {step}'], env=env, capture_output=True, text=True)


def test_lab_dockerfile_variant_selects_the_torch_index() -> None:
    cpu = lab_torch_step()
    assert cpu.returncode == 0 and cpu.stdout.split() == [
        "pip", "install", "--index-url", "https://download.pytorch.org/whl/cpu", "torch==2.13.0"], cpu
    cuda = lab_torch_step(VARIANT="cuda")
    assert cuda.stdout.split() == ["pip", "install", "--index-url", "https://pypi.org/simple", "torch==2.13.0"], cuda
    custom = lab_torch_step(VARIANT="cuda", TORCH_INDEX_URL="https://download.pytorch.org/whl/cu128")
    assert "https://download.pytorch.org/whl/cu128" in custom.stdout.split()
    vllm = lab_torch_step(VARIANT="cuda", EXTRAS="vllm")  # vLLM brings its own torch
    assert vllm.returncode == 0 and vllm.stdout == "", vllm
    for bad, message in (({"VARIANT": "rocm"}, "VARIANT must be cpu or cuda, got 'rocm'"),
                         ({"EXTRAS": "vllm"}, "EXTRAS=vllm needs VARIANT=cuda"),
                         ({"EXTRAS": "lora"}, "EXTRAS must be empty or vllm, got 'lora'")):
        refused = lab_torch_step(**bad)
        assert refused.returncode == 2 and message in refused.stderr, (bad, refused)
