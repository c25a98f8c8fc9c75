"""The deployment files under deploy/ are consistent with each other and with hacfed itself.

Nothing here starts a container (tests/integration/test_container_build.py builds one where a
runtime works). What is checked: every YAML parses and has the expected kinds; every volume mount
names a declared volume; the coordinator's state dir is the PVC (Kubernetes) or a named volume
(compose); secrets and public federation files are mounted read-only and hold no real keys; every
hacfed-server / hacfed-client command line in compose, Kubernetes, Slurm, the Dockerfiles and
make-secrets.sh parses with the real argparse parsers (so renaming a flag fails here); every COPY
source exists; deploy/coordinator-requirements.txt agrees with pyproject.toml and is enough to
import and use hacfed.server with nothing else importable; make-secrets.sh does what compose needs.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path, PurePosixPath

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from hacfed.clients import enrol as client_keys
from hacfed.clients import main as client_main
from hacfed.server import admin as server_admin
from hacfed.server import main as server_main
from hacfed.server import onboarding as server_onboarding

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
BIN = Path(sys.executable).parent


# ----------------------------------------------------------------------------------------------
# Helpers: command lines through the real parsers, YAML documents, pod specs, shell commands.


def check_cli(argv: list[str]) -> None:
    """Parse `argv` (program name first) with hacfed's own argparse parser for it; an unknown or
    renamed flag, a missing required one or a bad choice raises AssertionError with argparse's message."""
    program, args = PurePosixPath(argv[0]).name, argv[1:]
    if program == "hacfed-server":
        if args[:1] and args[0] in server_main.ONBOARDING_COMMANDS:
            parser = server_onboarding.build_parser()
        elif args[:1] and args[0] in server_admin.COMMANDS:
            parser = server_admin.build_parser()
        else:
            parser = server_main.build_parser()
    elif program == "hacfed-client":
        if args[:1] == ["keys"]:
            parser, args = client_keys.build_parser(), args[1:]
        elif args[:1] == ["replay"]:
            raise AssertionError("replay is not used by the deploy files; teach check_cli its parser first")
        else:
            parser = client_main.build_parser()
    else:
        raise AssertionError(f"not a hacfed command: {argv}")
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(args)
    except SystemExit as exc:
        raise AssertionError(f"{shlex.join(argv)}\n  -> {err.getvalue().strip() or exc}") from None


def flag_value(argv: list[str], flag: str) -> str:
    assert flag in argv, f"{flag} missing from {argv}"
    return argv[argv.index(flag) + 1]


def yaml_docs(path: Path) -> list[dict]:
    docs = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]
    assert docs and all(isinstance(d, dict) for d in docs), path
    return docs


def k8s_objects() -> list[dict]:
    return [d for p in sorted(K8S.glob("*.yaml")) if p.name != "kustomization.yaml" for d in yaml_docs(p)]


def k8s_object(kind: str, name: str) -> dict:
    found = [o for o in k8s_objects() if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name, found)
    return found[0]


def pod_specs() -> Iterator[tuple[str, dict]]:
    for obj in k8s_objects():
        if obj["kind"] in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
            yield obj["metadata"]["name"], obj["spec"]["template"]["spec"]


def containers(spec: dict) -> list[dict]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) pairs with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", "\n".join(l for l in path.read_text(encoding="utf-8").splitlines()
                                          if not l.lstrip().startswith("#")))
    return [(m.group(1).upper(), m.group(2).strip()) for m in re.finditer(r"^\s*([A-Za-z]+)\s+(.*)$", text, re.M)]


def image_entrypoint(dockerfile: str) -> list[str]:
    [entry] = [json.loads(rest) for ins, rest in dockerfile_instructions(DEPLOY / dockerfile) if ins == "ENTRYPOINT"]
    return entry


IMAGE_DOCKERFILE = {"hacfed-coordinator": "coordinator.Dockerfile", "hacfed-lab": "lab.Dockerfile"}


def container_argv(container: dict) -> list[str]:
    """What a Kubernetes container runs: its command, else the image's ENTRYPOINT, then its args."""
    image = container["image"].rsplit("/", 1)[-1].split(":")[0]
    command = container.get("command") or image_entrypoint(IMAGE_DOCKERFILE[image])
    return [*command, *container.get("args", [])]


def shell_hacfed_commands(path: Path) -> list[list[str]]:
    """Every hacfed-server / hacfed-client command line of a shell script, with each word that holds
    a shell expansion replaced by a placeholder value (so a flag's presence, not its value, is checked)."""
    text = re.sub(r"\\\n\s*", " ", path.read_text(encoding="utf-8"))
    commands = []
    for line in text.splitlines():
        if line.lstrip().startswith("#") or not re.search(r"hacfed-(server|client)\b", line):
            continue
        words = shlex.split(line, comments=True)
        start = next((i for i, w in enumerate(words) if re.search(r"(^|/)hacfed-(server|client)$", w)), None)
        if start is None:
            continue
        argv = [PurePosixPath(words[start]).name]
        for word in words[start + 1:]:
            if word in (";", "&&", "||", "|"):
                break
            argv.append("placeholder" if "$" in word and not word.startswith("-") else word)
        commands.append(argv)
    return commands


# ----------------------------------------------------------------------------------------------
# The checker itself: it must fail on a renamed flag, or every test below that uses it is vacuous.


def test_check_cli_refuses_a_renamed_flag_and_a_missing_required_one() -> None:
    good = ["hacfed-client", "keys", "--state-dir", "s", "--participant-id", "lab-a"]
    check_cli(good)
    with pytest.raises(AssertionError, match="--state-directory"):
        check_cli(["hacfed-client", "keys", "--state-directory", "s", "--participant-id", "lab-a"])
    with pytest.raises(AssertionError, match="--config"):
        check_cli(["hacfed-server", "--listen", "0.0.0.0:9092"])  # --config is required
    with pytest.raises(AssertionError, match="--tls-ca-file"):
        check_cli(["hacfed-client", "--model", "m", "--tls-ca-file", "ca.pem"])


# ----------------------------------------------------------------------------------------------
# YAML: parses, kinds.


@pytest.mark.parametrize("path", sorted(DEPLOY.rglob("*.yaml")), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_yaml_file_parses(path: Path) -> None:
    assert yaml_docs(path)


def test_k8s_objects_are_the_expected_kinds() -> None:
    kinds = sorted((o["kind"], o["metadata"]["name"]) for o in k8s_objects())
    assert kinds == sorted([
        ("Namespace", "hacfed"),
        ("PersistentVolumeClaim", "hacfed-coordinator-state"), ("Deployment", "hacfed-coordinator"),
        ("Service", "hacfed-coordinator"), ("Secret", "hacfed-coordinator-tls"),
        ("ConfigMap", "hacfed-federation"), ("PersistentVolumeClaim", "hacfed-lab-a-state"), ("Job", "hacfed-lab-a"),
    ])
    for obj in k8s_objects():
        if obj["kind"] != "Namespace":
            assert obj["metadata"]["namespace"] == "hacfed", obj["metadata"]
        assert obj["apiVersion"] == {"Deployment": "apps/v1", "Job": "batch/v1"}.get(obj["kind"], "v1")


def test_kustomization_lists_every_object_file_but_the_templates() -> None:
    [kust] = yaml_docs(K8S / "kustomization.yaml")
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    templates = {"coordinator-secret.yaml", "lab-federation-configmap.yaml"}
    assert set(kust["resources"]) == files - templates
    used_images = {c["image"].split(":")[0] for _, spec in pod_specs() for c in containers(spec)}
    assert {i["name"] for i in kust["images"]} == used_images


# ----------------------------------------------------------------------------------------------
# Kubernetes: volumes, the PVC, secrets, the GPU, the command lines.


@pytest.mark.parametrize("name,spec", list(pod_specs()), ids=[n for n, _ in pod_specs()])
def test_k8s_volume_mounts_match_declared_volumes(name: str, spec: dict) -> None:
    declared = {v["name"] for v in spec["volumes"]}
    mounted = {m["name"] for c in containers(spec) for m in c.get("volumeMounts", [])}
    assert mounted == declared, f"{name}: mounted {mounted}, declared {declared}"
    claims = {v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"] if "persistentVolumeClaim" in v}
    pvcs = {o["metadata"]["name"] for o in k8s_objects() if o["kind"] == "PersistentVolumeClaim"}
    assert claims <= pvcs


@pytest.mark.parametrize("name,spec", list(pod_specs()), ids=[n for n, _ in pod_specs()])
def test_k8s_secrets_and_federation_files_are_mounted_read_only(name: str, spec: dict) -> None:
    sensitive = {v["name"] for v in spec["volumes"] if "secret" in v or "configMap" in v}
    assert sensitive, name
    for container in containers(spec):
        for mount in container.get("volumeMounts", []):
            if mount["name"] in sensitive:
                assert mount.get("readOnly") is True, f"{name}/{container['name']}: {mount}"
    objects = {(o["kind"], o["metadata"]["name"]) for o in k8s_objects()}
    for volume in spec["volumes"]:
        if "secret" in volume:
            assert ("Secret", volume["secret"]["secretName"]) in objects
        if "configMap" in volume:
            assert ("ConfigMap", volume["configMap"]["name"]) in objects


def test_k8s_secret_and_configmap_are_templates_without_keys() -> None:
    secret = k8s_object("Secret", "hacfed-coordinator-tls")
    assert "data" not in secret and set(secret["stringData"]) == {"server.pem", "server.key", "ca.pem"}
    config = k8s_object("ConfigMap", "hacfed-federation")
    assert set(config["data"]) == {"ca.pem", "coordinator.pub"}
    for value in [*secret["stringData"].values(), *config["data"].values()]:
        body = [line for line in value.splitlines() if not line.startswith("-----")]
        assert body and all(line.startswith("REPLACE") for line in body), value


def mount_of(container: dict, spec: dict, path: str) -> tuple[dict, dict]:
    """The volume mount (and its volume) that holds `path`: the longest mountPath above it."""
    mounts = [m for m in container["volumeMounts"]
              if PurePosixPath(path) == PurePosixPath(m["mountPath"]) or PurePosixPath(m["mountPath"]) in PurePosixPath(path).parents]
    assert mounts, f"{path} is on no volume of {container['name']}"
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    [volume] = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    return mount, volume


def test_k8s_coordinator_state_dir_is_the_pvc_and_tls_files_the_secret() -> None:
    deployment = k8s_object("Deployment", "hacfed-coordinator")
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate"
    spec = deployment["spec"]["template"]["spec"]
    [container] = spec["containers"]
    argv = container_argv(container)
    check_cli(argv)
    assert argv[0] == "hacfed-server"
    _, state = mount_of(container, spec, flag_value(argv, "--state-dir"))
    assert state["persistentVolumeClaim"]["claimName"] == "hacfed-coordinator-state"
    assert k8s_object("PersistentVolumeClaim", "hacfed-coordinator-state")["spec"]["accessModes"] == ["ReadWriteOnce"]
    for flag, key in (("--tls-cert", "server.pem"), ("--tls-key", "server.key"), ("--tls-ca", "ca.pem")):
        path = flag_value(argv, flag)
        mount, volume = mount_of(container, spec, path)
        assert volume["secret"]["secretName"] == "hacfed-coordinator-tls" and mount["readOnly"] is True
        assert PurePosixPath(path).name == key
    assert volume["secret"]["defaultMode"] == 0o440  # readable by fsGroup 10001, the image's user
    assert spec["securityContext"]["fsGroup"] == spec["securityContext"]["runAsUser"] == 10001
    port = int(flag_value(argv, "--listen").rsplit(":", 1)[1])
    assert flag_value(argv, "--listen").startswith("0.0.0.0:")
    assert [p["containerPort"] for p in container["ports"]] == [port]
    service = k8s_object("Service", "hacfed-coordinator")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [(port, container["ports"][0]["name"])]


def test_k8s_lab_job_requests_a_gpu_and_keeps_its_keys_on_its_pvc() -> None:
    job = k8s_object("Job", "hacfed-lab-a")
    spec = job["spec"]["template"]["spec"]
    assert spec["restartPolicy"] == "OnFailure"
    [keys], [lab] = spec["initContainers"], spec["containers"]
    keys_argv, lab_argv = container_argv(keys), container_argv(lab)
    check_cli(keys_argv)
    check_cli(lab_argv)
    assert keys_argv[:2] == ["hacfed-client", "keys"] and lab_argv[0] == "hacfed-client"
    assert lab["resources"]["requests"]["nvidia.com/gpu"] == lab["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert flag_value(lab_argv, "--device") == "cuda:0"
    state_dir = flag_value(lab_argv, "--state-dir")
    assert flag_value(keys_argv, "--state-dir") == state_dir
    assert flag_value(keys_argv, "--participant-id") == flag_value(lab_argv, "--participant-id") == "lab-a"
    _, state = mount_of(lab, spec, state_dir)
    assert state["persistentVolumeClaim"]["claimName"] == "hacfed-lab-a-state"
    assert mount_of(keys, spec, state_dir)[1] == state
    for flag, key in (("--coordinator-key", "coordinator.pub"), ("--tls-ca", "ca.pem")):
        mount, volume = mount_of(lab, spec, flag_value(lab_argv, flag))
        assert volume["configMap"]["name"] == "hacfed-federation" and mount["readOnly"] is True
        assert PurePosixPath(flag_value(lab_argv, flag)).name == key


# ----------------------------------------------------------------------------------------------
# Compose.


def compose() -> dict:
    [doc] = yaml_docs(DEPLOY / "compose.yaml")
    return doc


def compose_mounts(service: dict) -> list[tuple[str, str, bool]]:
    """(volume, path in the container, read-only) of each `volume:path[:ro]` entry."""
    mounts = []
    for entry in service.get("volumes", []):
        parts = entry.split(":")
        assert len(parts) in (2, 3) and parts[2:] in ([], ["ro"]), entry
        mounts.append((parts[0], parts[1], parts[2:] == ["ro"]))
    return mounts


def compose_volume_at(service: dict, path: str) -> tuple[str, str, bool]:
    found = [m for m in compose_mounts(service)
             if PurePosixPath(path) == PurePosixPath(m[1]) or PurePosixPath(m[1]) in PurePosixPath(path).parents]
    assert found, f"{path} is on no volume"
    return max(found, key=lambda m: len(m[1]))


def test_compose_services_volumes_and_builds() -> None:
    doc = compose()
    services = doc["services"]
    assert set(services) == {"secrets", "coordinator", "lab-a", "lab-b"}
    used = {m[0] for s in services.values() for m in compose_mounts(s)}
    assert used == set(doc["volumes"]), "every mounted volume is declared, every declared one mounted"
    assert [name for name, s in services.items() if "operator" in {m[0] for m in compose_mounts(s)}] == ["secrets"]
    for name, service in services.items():
        if "build" in service:
            context = (DEPLOY / service["build"]["context"]).resolve()
            assert context == REPO and (context / service["build"]["dockerfile"]).is_file(), name
        assert service["image"].split(":")[0] in IMAGE_DOCKERFILE
        for dep, cond in service.get("depends_on", {}).items():
            assert dep in services and cond["condition"] in ("service_completed_successfully", "service_started")
    assert services["coordinator"]["depends_on"]["secrets"]["condition"] == "service_completed_successfully"


def test_compose_command_lines_and_paths_agree() -> None:
    services = compose()["services"]
    secrets = services["secrets"]
    env = secrets["environment"]
    assert secrets["entrypoint"][-1] == "/usr/local/bin/hacfed-make-secrets"  # the image's copy of make-secrets.sh
    coordinator = services["coordinator"]
    server_argv = [*coordinator["entrypoint"], *coordinator["command"]]
    check_cli(server_argv)
    assert server_argv[0] == "hacfed-server"
    state_dir = flag_value(server_argv, "--state-dir")
    volume, path, ro = compose_volume_at(coordinator, state_dir)
    assert (volume, path, ro) == (compose_volume_at(secrets, env["COORDINATOR_STATE"])[0], state_dir, False)
    assert env["COORDINATOR_STATE"] == state_dir
    certs_volume = compose_volume_at(secrets, env["CERTS_DIR"])[0]
    for flag in ("--tls-cert", "--tls-key", "--tls-ca"):
        volume, _, ro = compose_volume_at(coordinator, flag_value(server_argv, flag))
        assert volume == certs_volume and ro, flag
    host, port = flag_value(server_argv, "--listen").rsplit(":", 1)
    assert host == "0.0.0.0" and coordinator["ports"] == [f"{port}:{port}"]
    public_volume = compose_volume_at(secrets, env["PUBLIC_DIR"])[0]
    labs = [name for name in services if name.startswith("lab-")]
    assert env["LABS"].split() == labs
    for lab in labs:
        service = services[lab]
        argv = [*service["entrypoint"], *service["command"]]
        check_cli(argv)
        assert flag_value(argv, "--participant-id") == lab
        assert flag_value(argv, "--server") == f"coordinator:{port}" and "coordinator" in env["COORDINATOR_HOSTS"].split(",")
        for flag in ("--coordinator-key", "--tls-ca"):
            volume, _, ro = compose_volume_at(service, flag_value(argv, flag))
            assert volume == public_volume and ro, (lab, flag)
        # make-secrets.sh creates the lab's keys in LAB_ROOT/<id>/lab on the volume the lab mounts
        lab_volume, lab_mount, ro = compose_volume_at(service, flag_value(argv, "--state-dir"))
        assert not ro and PurePosixPath(flag_value(argv, "--state-dir")) == PurePosixPath(lab_mount) / "lab"
        assert compose_volume_at(secrets, f"{env['LAB_ROOT']}/{lab}/lab")[0] == lab_volume
    assert len({services[lab]["command"][services[lab]["command"].index("--model") + 1] for lab in labs}) == 2


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
            "coordinator/coordinator.key", "labs/lab-a/lab/participant.key", "labs/lab-b/lab/supernode.key"} <= set(first)
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
    assert changed == [] or all(p.endswith("enrolment.txt") or p.startswith("coordinator/audit") for p in changed), changed
    assert {p: v for p, v in second.items() if p.endswith((".key", ".pem", ".pub"))} == \
           {p: v for p, v in first.items() if p.endswith((".key", ".pem", ".pub"))}


# ----------------------------------------------------------------------------------------------
# deploy/coordinator-requirements.txt: the coordinator image's dependencies.


def coordinator_requirements(name: str = "coordinator-requirements.txt") -> list[Requirement]:
    lines = (DEPLOY / name).read_text().splitlines()
    return [Requirement(line) for line in lines if line.strip() and not line.lstrip().startswith("#")]


def test_coordinator_requirements_repeat_pyprojects_specifiers() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pinned = {canonicalize_name(r.name): r for r in map(Requirement, project["dependencies"])}
    for req in [*coordinator_requirements(), *coordinator_requirements("coordinator-data-requirements.txt")]:
        name = canonicalize_name(req.name)
        assert name in pinned, f"{req} is not a dependency in pyproject.toml"
        assert req.specifier == pinned[name].specifier and req.extras == pinned[name].extras, (req, pinned[name])
    names = {canonicalize_name(r.name) for r in coordinator_requirements()}
    assert not names & {"torch", "transformers", "datasets", "peft", "accelerate", "tokenizers"}


def dependency_closure(requirements: list[Requirement]) -> set[str]:
    """The installed distributions `requirements` pull in, recursively (as pip would resolve them)."""
    seen: set[str] = set()
    todo = [(r, frozenset(r.extras)) for r in requirements]
    while todo:
        req, extras = todo.pop()
        name = canonicalize_name(req.name)
        key = f"{name}[{','.join(sorted(extras))}]"
        if key in seen:
            continue
        seen.add(key)
        for text in metadata.requires(req.name) or []:
            dep = Requirement(text)
            if dep.marker is None or any(dep.marker.evaluate({"extra": e}) for e in ["", *extras]):
                todo.append((dep, frozenset(dep.extras)))
    return {k.split("[")[0] for k in seen}


def isolated_site(root: Path, requirements: list[Requirement]) -> Path:
    """A site-packages folder holding only what the coordinator image would: symlinks to the
    installed distributions of `requirements` and their dependencies (packages, modules and
    .dist-info), and hacfed laid out as `pip install --no-deps .` installs it."""
    closure, site = dependency_closure(requirements), root / "site-packages"
    site.mkdir(parents=True)
    for dist in metadata.distributions():
        if canonicalize_name(dist.metadata["Name"]) not in closure:
            continue
        for file in dist.files or []:
            top = file.parts[0]
            if top in ("..", "__pycache__") or top.endswith(".pth") or (site / top).exists():
                continue
            if top.endswith(".dist-info") or len(file.parts) > 1 or top.endswith((".py", ".so")):
                (site / top).symlink_to(dist.locate_file(top))
    hacfed = site / "hacfed"
    hacfed.mkdir()
    for child in (REPO / "hacfed").iterdir():
        if child.name != "__pycache__":
            (hacfed / child.name).symlink_to(child)
    for name in ("server", "clients", "proto"):  # pyproject.toml's package-dir
        (hacfed / name).symlink_to(REPO / name)
    return site


ISOLATED_RUN = r"""
import sys
site, tmp, deploy = sys.argv[1:4]
# Only the standard library and the isolated site: as in the image, where nothing else is installed.
sys.path[:] = [p for p in sys.path if p and "site-packages" not in p and p != "."] + [site]
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__ + repr(f)]
sys.path_hooks[:] = [h for h in sys.path_hooks if "editable" not in repr(h).lower()]
sys.path_importer_cache.clear()
import importlib, importlib.metadata, importlib.util, json, pkgutil
assert importlib.util.find_spec("torch") is None and importlib.util.find_spec("transformers") is None
import hacfed.server
assert hacfed.server.__file__.startswith(site), hacfed.server.__file__
names = [m.name for m in pkgutil.walk_packages(hacfed.server.__path__, "hacfed.server.")]
assert {"hacfed.server.main", "hacfed.server.serverapp", "hacfed.server.driver"} <= set(names), names
for name in [*names, "hacfed.clients.enrol", "hacfed.clients.main"]:
    importlib.import_module(name)
import uvicorn  # hacfed.server.dashboard.serve imports it when hacfed-server runs with --dashboard
from hacfed.server.main import main
assert main(["certs", "init", "--dir", tmp + "/certs", "--hosts", "coordinator"]) == 0
from hacfed.clients.main import main as client_main
assert client_main(["keys", "--state-dir", tmp + "/lab-a", "--participant-id", "lab-a"]) == 0
from hacfed.server.config import load_server_config
from hacfed.server.runner import check_before_writing
tls = {"tls_cert": tmp + "/certs/server.pem", "tls_key": tmp + "/certs/server.key", "tls_ca": tmp + "/certs/ca.pem"}
check_before_writing(load_server_config(deploy + "/coordinator.toml", [], {"state_dir": tmp + "/state", **tls}))
from math_verify import parse, verify  # the verifier's sandboxed worker imports it
assert verify(parse("$\\frac{1}{2}$"), parse("$0.5$"))
from hacfed.tasks.registry import load_task
try:  # the commented-out GSM8K [task] of deploy/coordinator.toml
    load_task({"kind": "jsonl", "name": "gsm8k", "train_files": ["../hacfed/data/gsm8k/train.jsonl"],
               "eval_files": ["../hacfed/data/gsm8k/test.jsonl"], "answer_format": "gsm8k"}, deploy).train_problems()
    data_task = "loaded"
except ModuleNotFoundError as exc:
    data_task = f"needs {exc.name}"
assert "torch" not in sys.modules and "transformers" not in sys.modules
by_module = importlib.metadata.packages_distributions()
dists = sorted({d for m in list(sys.modules) for d in by_module.get(m.partition(".")[0], [])})
print(json.dumps({"dists": dists, "data_task": data_task}))
"""


def isolated_run(requirements: list[Requirement], tmp_path: Path) -> dict:
    site = isolated_site(tmp_path, requirements)
    assert (site / "flwr").exists() and not (site / "torch").exists() and not (site / "transformers").exists()
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf")}  # datasets' cache, which the image keeps in HACFED_HOME
    result = subprocess.run([sys.executable, "-c", ISOLATED_RUN, str(site), str(work), str(DEPLOY)],
                            capture_output=True, text=True, timeout=600, cwd=work, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_hacfed_server_runs_with_only_the_coordinator_requirements(tmp_path: Path) -> None:
    report = isolated_run(coordinator_requirements(), tmp_path)
    # Every listed requirement is used: the image carries nothing hacfed-server does not import.
    imported = {canonicalize_name(d) for d in report["dists"]}
    assert {canonicalize_name(r.name) for r in coordinator_requirements()} <= imported, imported
    # A task read from files (GSM8K) needs `datasets`: the image's DATA_TASKS=1 variant adds it.
    assert report["data_task"] == "needs datasets", report


def test_the_data_tasks_variant_loads_gsm8k_without_torch(tmp_path: Path) -> None:
    extra = coordinator_requirements("coordinator-data-requirements.txt")
    report = isolated_run([*coordinator_requirements(), *extra], tmp_path)
    assert report["data_task"] == "loaded", report
    assert {canonicalize_name(r.name) for r in extra} <= {canonicalize_name(d) for d in report["dists"]}


def lab_torch_step(**build_args: str) -> subprocess.CompletedProcess[str]:
    """The lab Dockerfile's torch RUN step under sh, with its ARG defaults and `build_args`, and
    `pip` replaced by a function that prints its arguments (nothing is installed)."""
    instructions = dockerfile_instructions(DEPLOY / "lab.Dockerfile")
    [step] = [rest for ins, rest in instructions if ins == "RUN" and "VARIANT" in rest]
    args = dict(rest.split("=", 1) for ins, rest in instructions if ins == "ARG" and rest != "PYTHON_IMAGE=python:3.11-slim-bookworm")
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
