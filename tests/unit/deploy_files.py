"""Readers of the files under deploy/ that the deploy tests share, and the command-line checker.

`check_cli` parses a hacfed-server / hacfed-client command line with hacfed's own argparse parsers,
so a renamed flag in compose, Kubernetes, Slurm, a Dockerfile or make-secrets.sh fails a test;
test_deploy_manifests.py checks that it can fail.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import yaml

from hacfed.clients import enrol as client_keys
from hacfed.clients import main as client_main
from hacfed.server import admin as server_admin
from hacfed.server import main as server_main
from hacfed.server import onboarding as server_onboarding

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
BIN = Path(sys.executable).parent


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


def compose_services() -> dict[str, dict]:
    """deploy/compose.yaml's services, YAML anchors and merge keys resolved."""
    [doc] = yaml_docs(DEPLOY / "compose.yaml")
    return doc["services"]


def compose_default(value: object) -> str:
    """A compose value with each `${VAR:-default}` replaced by its default (what runs with VAR unset);
    a `${VAR}` without a default raises AssertionError."""
    text = str(value)
    bare = re.search(r"\$\{(\w+)\}", text)
    assert bare is None, f"{text}: {bare and bare.group(1)} has no default"
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", text)


def dockerfile_env(dockerfile: str) -> dict[str, str]:
    """The image's ENV settings (KEY=VALUE form)."""
    env: dict[str, str] = {}
    for ins, rest in dockerfile_instructions(DEPLOY / dockerfile):
        if ins == "ENV":
            env.update(word.split("=", 1) for word in shlex.split(rest))
    return env


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
