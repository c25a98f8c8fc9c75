"""Every container under deploy/ is hardened, and still has somewhere to write.

Compose: each service has a read-only root, drops every capability (only the root `secrets`
service adds back the three it needs), sets no-new-privileges, and has CPU, memory and process
limits. Kubernetes: each container has the restricted securityContext, CPU, memory and
ephemeral-storage limits; no pod mounts a service-account token; a NetworkPolicy limits every pod.
With a read-only root, each path a process writes (/tmp, its state dir, the image's HACFED_HOME and
HF_HOME) must be on a writable volume or tmpfs. The verifier sandbox fails closed: nothing in
deploy/ sets network = "off-unsafe". The base images are either pinned by digest or the pinning
script is there and works. Failures name the service (or container) and the field.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import tomllib
from pathlib import Path, PurePosixPath

import pytest

from hacfed.tasks.sandbox import SandboxLimits
from tests.unit.deploy_files import (
    DEPLOY,
    IMAGE_DOCKERFILE,
    REPO,
    compose_default,
    compose_services,
    container_argv,
    containers,
    dockerfile_env,
    dockerfile_instructions,
    flag_value,
    k8s_objects,
)

ROOT_CAPABILITIES = {"CHOWN", "DAC_OVERRIDE", "FOWNER"}  # the secrets service: root writing others' volumes
SERVICES = sorted(compose_services())


def under(path: str, mount: str) -> bool:
    return PurePosixPath(path) == PurePosixPath(mount) or PurePosixPath(mount) in PurePosixPath(path).parents


def written_paths(argv: list[str], image: str) -> set[str]:
    """What a hacfed process in `image` writes: /tmp, its --state-dir, HACFED_HOME and HF_HOME."""
    paths = {"/tmp"}
    if "--state-dir" in argv:
        paths.add(flag_value(argv, "--state-dir"))
    env = dockerfile_env(IMAGE_DOCKERFILE[image])
    paths |= {env[k] for k in ("HACFED_HOME", "HF_HOME") if k in env}
    return paths


# ----------------------------------------------------------------------------------------------
# Compose.


def test_compose_has_the_expected_services() -> None:
    assert SERVICES == ["coordinator", "lab-a", "lab-b", "secrets"]


@pytest.mark.parametrize("name", SERVICES)
def test_compose_service_is_hardened(name: str) -> None:
    service = compose_services()[name]
    assert service.get("read_only") is True, f"compose service {name}: read_only is not true"
    assert service.get("cap_drop") == ["ALL"], f"compose service {name}: cap_drop is {service.get('cap_drop')}"
    added = set(service.get("cap_add", []))
    if service.get("user") in ("0:0", "0", "root"):
        assert added <= ROOT_CAPABILITIES, f"compose service {name}: cap_add {sorted(added - ROOT_CAPABILITIES)}"
    else:
        assert not added, f"compose service {name}: cap_add {sorted(added)} for a non-root service"
    assert "no-new-privileges:true" in service.get("security_opt", []), \
        f"compose service {name}: security_opt lacks no-new-privileges:true"
    assert service.get("privileged") is not True, f"compose service {name}: privileged"


@pytest.mark.parametrize("name", SERVICES)
def test_compose_service_has_cpu_memory_and_pids_limits(name: str) -> None:
    service = compose_services()[name]
    for field in ("cpus", "mem_limit", "pids_limit"):
        assert field in service, f"compose service {name}: no {field}"
    cpus = float(compose_default(service["cpus"]))
    assert 0 < cpus <= 2, f"compose service {name}: cpus {cpus} (a default above 2 fails on a 2-core host)"
    memory = compose_default(service["mem_limit"])
    assert re.fullmatch(r"[1-9]\d*[mg]", memory), f"compose service {name}: mem_limit {memory!r}"
    pids = int(compose_default(service["pids_limit"]))
    assert 64 <= pids <= 8192, f"compose service {name}: pids_limit {pids}"


@pytest.mark.parametrize("name", SERVICES)
def test_compose_service_can_write_what_it_writes(name: str) -> None:
    service = compose_services()[name]
    writable = [entry.split(":")[1] for entry in service.get("volumes", []) if not entry.endswith(":ro")]
    tmpfs = [entry.split(":")[0] for entry in service.get("tmpfs", [])]
    assert "/tmp" in tmpfs, f"compose service {name}: tmpfs has no /tmp"
    argv = [*service.get("entrypoint", []), *service.get("command", [])]
    if argv[0].startswith("hacfed-"):
        paths = written_paths(argv, service["image"].split(":")[0])
    else:  # make-secrets.sh: /tmp, the folders its environment names, and LAB_ROOT/<lab>/lab for each lab
        assert argv[-1] == "/usr/local/bin/hacfed-make-secrets", argv
        env = service["environment"]
        paths = {"/tmp"} | {v for k, v in env.items() if k.endswith(("_DIR", "_STATE"))}
        paths |= {f"{env['LAB_ROOT']}/{lab}/lab" for lab in env["LABS"].split()}
    for path in sorted(paths):
        assert any(under(path, m) for m in writable + tmpfs), \
            f"compose service {name}: {path} is on the read-only root (no writable volume or tmpfs holds it)"


# ----------------------------------------------------------------------------------------------
# Kubernetes.


def pods() -> list[tuple[str, dict, dict]]:
    """(name, pod template metadata, pod spec) of every workload."""
    return [(o["metadata"]["name"], o["spec"]["template"]["metadata"], o["spec"]["template"]["spec"])
            for o in k8s_objects() if o["kind"] in ("Deployment", "Job", "StatefulSet", "DaemonSet")]


POD_NAMES = [name for name, _, _ in pods()]
CONTAINERS = [(name, c["name"]) for name, _, spec in pods() for c in containers(spec)]


def k8s_container(pod: str, container: str) -> tuple[dict, dict]:
    [spec] = [s for n, _, s in pods() if n == pod]
    [found] = [c for c in containers(spec) if c["name"] == container]
    return spec, found


@pytest.mark.parametrize("pod", POD_NAMES)
def test_k8s_pod_mounts_no_service_account_token_and_uses_runtime_default_seccomp(pod: str) -> None:
    [spec] = [s for n, _, s in pods() if n == pod]
    assert spec.get("automountServiceAccountToken") is False, f"{pod}: automountServiceAccountToken is not false"
    context = spec.get("securityContext", {})
    assert context.get("runAsNonRoot") is True, f"{pod}: pod securityContext.runAsNonRoot"
    assert context.get("seccompProfile") == {"type": "RuntimeDefault"}, f"{pod}: pod securityContext.seccompProfile"
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        assert not spec.get(flag), f"{pod}: {flag}"


@pytest.mark.parametrize("pod,container", CONTAINERS, ids=[f"{p}/{c}" for p, c in CONTAINERS])
def test_k8s_container_security_context(pod: str, container: str) -> None:
    _, c = k8s_container(pod, container)
    context = c.get("securityContext", {})
    expected = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                "readOnlyRootFilesystem": True, "runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    for field, value in expected.items():
        assert context.get(field) == value, f"{pod}/{container}: securityContext.{field} is {context.get(field)!r}"
    assert not context.get("privileged"), f"{pod}/{container}: securityContext.privileged"


@pytest.mark.parametrize("pod,container", CONTAINERS, ids=[f"{p}/{c}" for p, c in CONTAINERS])
def test_k8s_container_has_cpu_memory_and_ephemeral_storage_limits(pod: str, container: str) -> None:
    _, c = k8s_container(pod, container)
    resources = c.get("resources", {})
    for field in ("cpu", "memory", "ephemeral-storage"):
        assert field in resources.get("limits", {}), f"{pod}/{container}: resources.limits.{field} missing"
        assert field in resources.get("requests", {}), f"{pod}/{container}: resources.requests.{field} missing"


@pytest.mark.parametrize("pod,container", CONTAINERS, ids=[f"{p}/{c}" for p, c in CONTAINERS])
def test_k8s_container_can_write_what_it_writes(pod: str, container: str) -> None:
    spec, c = k8s_container(pod, container)
    volumes = {v["name"]: v for v in spec["volumes"]}
    writable = [m["mountPath"] for m in c.get("volumeMounts", []) if not m.get("readOnly")
                and ("emptyDir" in volumes[m["name"]] or "persistentVolumeClaim" in volumes[m["name"]])]
    image = c["image"].rsplit("/", 1)[-1].split(":")[0]
    for path in sorted(written_paths(container_argv(c), image)):
        assert any(under(path, m) for m in writable), \
            f"{pod}/{container}: {path} is on the read-only root (no writable volume holds it)"
    for name, volume in volumes.items():
        if "emptyDir" in volume:
            assert "sizeLimit" in volume["emptyDir"], f"{pod}: emptyDir {name} has no sizeLimit"


def network_policies() -> list[dict]:
    return [o for o in k8s_objects() if o["kind"] == "NetworkPolicy"]


@pytest.mark.parametrize("pod", POD_NAMES)
def test_k8s_pod_is_selected_by_a_network_policy_for_both_directions(pod: str) -> None:
    [labels] = [meta["labels"] for n, meta, _ in pods() if n == pod]
    selecting = [p for p in network_policies()
                 if p["spec"]["podSelector"]["matchLabels"].items() <= labels.items()]
    assert selecting, f"{pod}: no NetworkPolicy selects its labels {labels}"
    types = {t for p in selecting for t in p["spec"].get("policyTypes", [])}
    assert types == {"Ingress", "Egress"}, f"{pod}: NetworkPolicy policyTypes {sorted(types)}"


def policy_ports(rules: list[dict]) -> set[tuple[str, int]]:
    return {(p.get("protocol", "TCP"), p["port"]) for rule in rules for p in rule.get("ports", [])}


def test_k8s_network_policies_open_only_the_fleet_port_and_dns() -> None:
    [coordinator] = [p for p in network_policies() if p["metadata"]["name"] == "hacfed-coordinator"]
    [lab] = [p for p in network_policies() if p["metadata"]["name"] == "hacfed-lab"]
    _, server = k8s_container("hacfed-coordinator", "coordinator")
    port = int(flag_value(container_argv(server), "--listen").rsplit(":", 1)[1])
    assert policy_ports(coordinator["spec"]["ingress"]) == {("TCP", port)}, "coordinator: NetworkPolicy ingress"
    assert all("ports" in rule for rule in coordinator["spec"]["ingress"]), "coordinator: an ingress rule on any port"
    assert coordinator["spec"]["egress"] == [], "coordinator: NetworkPolicy egress is not empty"
    assert lab["spec"]["ingress"] == [], "lab: NetworkPolicy ingress is not empty"
    _, client = k8s_container("hacfed-lab-a", "lab")
    server_port = int(flag_value(container_argv(client), "--server").rsplit(":", 1)[1])
    assert policy_ports(lab["spec"]["egress"]) == {("UDP", 53), ("TCP", 53), ("TCP", server_port)}, \
        "lab: NetworkPolicy egress"
    assert all("ports" in rule for rule in lab["spec"]["egress"]), "lab: an egress rule on any port"


# ----------------------------------------------------------------------------------------------
# The verifier sandbox fails closed.


def active_lines(path: Path) -> list[str]:
    return [line for line in path.read_text(encoding="utf-8").splitlines() if not line.lstrip().startswith("#")]


def test_the_sandbox_default_is_required_and_nothing_in_deploy_opts_out() -> None:
    [network] = [f for f in dataclasses.fields(SandboxLimits) if f.name == "network"]
    assert network.default == "required"
    files = [p for p in DEPLOY.rglob("*") if p.is_file() and p.suffix != ".md"]
    assert len(files) > 10
    for path in files:
        for line in active_lines(path):
            assert "off-unsafe" not in line, f"{path.relative_to(REPO)}: {line.strip()}"
    for name in ("coordinator.toml", "participant.toml"):
        task = tomllib.loads((DEPLOY / name).read_text(encoding="utf-8")).get("task", {})
        for table in (task.get("sandbox", {}), task.get("verifier", {}).get("sandbox", {})):
            assert table.get("network", "required") == "required", f"{name}: sandbox network {table['network']}"


def test_the_gsm8k_alternative_in_coordinator_toml_asks_for_network_isolation() -> None:
    text = (DEPLOY / "coordinator.toml").read_text(encoding="utf-8")
    block = text[text.index("# GSM8K instead"):text.index("# Your own task")].splitlines()[1:]
    settings = tomllib.loads("\n".join(re.sub(r"^# ", "", line) for line in block))
    assert settings["kind"] == "jsonl" and settings["task"]["verifier"]["sandbox"]["network"] == "required"


# ----------------------------------------------------------------------------------------------
# Base images: pinned by digest, or pinnable with scripts/pin-images.sh.

PIN_SCRIPT = REPO / "scripts" / "pin-images.sh"
DIGEST = "sha256:" + "0123456789abcdef" * 4


def base_image(dockerfile: Path) -> str:
    [ref] = [rest.split("=", 1)[1] for ins, rest in dockerfile_instructions(dockerfile)
             if ins == "ARG" and rest.startswith("PYTHON_IMAGE=")]
    return ref


@pytest.mark.parametrize("name", sorted(IMAGE_DOCKERFILE.values()))
def test_base_image_is_pinned_by_digest_or_the_pin_script_exists(name: str) -> None:
    ref = base_image(DEPLOY / name)
    pinned = re.fullmatch(r"[\w./:-]+@sha256:[0-9a-f]{64}", ref)
    assert pinned or (re.fullmatch(r"[\w./-]+:[\w.-]+", ref) and os.access(PIN_SCRIPT, os.X_OK)), \
        f"{name}: base image {ref!r} is neither pinned by digest nor pinnable with {PIN_SCRIPT.name}"


def run_pin(deploy: Path, bin_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DEPLOY_DIR": str(deploy), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(["sh", str(PIN_SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)


def test_pin_script_pins_each_base_by_the_registry_digest(tmp_path: Path) -> None:
    deploy, bin_dir = tmp_path / "deploy", tmp_path / "bin"
    deploy.mkdir(), bin_dir.mkdir()
    for name in IMAGE_DOCKERFILE.values():
        (deploy / name).write_text((DEPLOY / name).read_text(encoding="utf-8").replace(
            base_image(DEPLOY / name), "python:3.11-slim-bookworm"), encoding="utf-8")
    crane = bin_dir / "crane"  # a stand-in for the registry lookup: records its arguments
    crane.write_text(f'#!/bin/sh\necho "$*" >> "{tmp_path}/calls"\necho "${{FAKE_DIGEST:-{DIGEST}}}"\n')
    crane.chmod(0o755)
    assert run_pin(deploy, bin_dir, "--check").returncode == 1
    result = run_pin(deploy, bin_dir)
    assert result.returncode == 0, result.stderr
    for name in IMAGE_DOCKERFILE.values():
        assert base_image(deploy / name) == f"python:3.11-slim-bookworm@{DIGEST}", name
        original = (DEPLOY / name).read_text(encoding="utf-8").splitlines()
        changed = [a for a, b in zip(original, (deploy / name).read_text().splitlines(), strict=True) if a != b]
        assert [line.split("=")[0] for line in changed] == ["ARG PYTHON_IMAGE"], changed
    calls = (tmp_path / "calls").read_text().split("\n")
    assert calls[0] == "digest docker.io/library/python:3.11-slim-bookworm"
    assert run_pin(deploy, bin_dir, "--check").returncode == 0
    again = run_pin(deploy, bin_dir)  # re-pinning looks the tag up again, not tag@digest
    assert again.returncode == 0 and base_image(deploy / "lab.Dockerfile").count("@") == 1
    bad = subprocess.run(["sh", "-c", f'FAKE_DIGEST=oops sh "{PIN_SCRIPT}"'], capture_output=True, text=True,
                         env={**os.environ, "DEPLOY_DIR": str(deploy), "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert bad.returncode == 1 and "expected a sha256 digest, got 'oops'" in bad.stderr
