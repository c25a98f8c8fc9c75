"""The Kubernetes manifests and compose file under deploy/ agree with each other and with hacfed.

Nothing here starts a container (tests/integration/test_container_build.py builds one where a
runtime works). What is checked: every YAML parses and has the expected kinds; every volume mount
names a declared volume; the coordinator's state dir is the PVC (Kubernetes) or a named volume
(compose); secrets and public federation files are mounted read-only and hold no real keys; every
hacfed-server / hacfed-client command line in compose and Kubernetes parses with the real argparse
parsers (so renaming a flag fails here). The Dockerfiles, Slurm and make-secrets.sh are checked in
test_deploy_images.py, deploy/coordinator-requirements.txt in test_deploy_requirements.py.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import pytest

from tests.unit.deploy_files import (
    DEPLOY,
    IMAGE_DOCKERFILE,
    K8S,
    REPO,
    check_cli,
    container_argv,
    containers,
    flag_value,
    k8s_object,
    k8s_objects,
    pod_specs,
    yaml_docs,
)

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
        ("NetworkPolicy", "hacfed-coordinator"), ("NetworkPolicy", "hacfed-lab"),
    ])
    api = {"Deployment": "apps/v1", "Job": "batch/v1", "NetworkPolicy": "networking.k8s.io/v1"}
    for obj in k8s_objects():
        if obj["kind"] != "Namespace":
            assert obj["metadata"]["namespace"] == "hacfed", obj["metadata"]
        assert obj["apiVersion"] == api.get(obj["kind"], "v1")


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
              if PurePosixPath(path) == PurePosixPath(m["mountPath"])
              or PurePosixPath(m["mountPath"]) in PurePosixPath(path).parents]
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
        assert flag_value(argv, "--server") == f"coordinator:{port}"
        assert "coordinator" in env["COORDINATOR_HOSTS"].split(",")
        for flag in ("--coordinator-key", "--tls-ca"):
            volume, _, ro = compose_volume_at(service, flag_value(argv, flag))
            assert volume == public_volume and ro, (lab, flag)
        # make-secrets.sh creates the lab's keys in LAB_ROOT/<id>/lab on the volume the lab mounts
        lab_volume, lab_mount, ro = compose_volume_at(service, flag_value(argv, "--state-dir"))
        assert not ro and PurePosixPath(flag_value(argv, "--state-dir")) == PurePosixPath(lab_mount) / "lab"
        assert compose_volume_at(secrets, f"{env['LAB_ROOT']}/{lab}/lab")[0] == lab_volume
    assert len({services[lab]["command"][services[lab]["command"].index("--model") + 1] for lab in labs}) == 2
