"""hacfed-client's typed configuration: one lab's local choices (docs/style.md rule 5).

    cfg = load_client_config("deploy/participant.toml", flags={"model": "tiny-gpt2"}, task_sets=["digits=3"])

TOML layout (deploy/participant.toml): one flat `[participant]` table with the fields of `ClientConfig`
and the `PARTICIPANT_KEYS` of the lab's `ParticipantConfig` (`setting_names()`), and a `[task]` table
that must equal the coordinator's `[task]` (the client checks every plan against it).
Command-line flags override the file; `--task KEY=VALUE` overrides `[task]` keys. Without any task
settings the task is 2-digit addition (`kind = "arithmetic"`, `digits = 2`, `operators = "+"`).
Every error names the field and the bad value.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from hacfed.certs import check_ca_cert
from hacfed.clients.participant_config import ParticipantConfig
from hacfed.clients.slowdown import check_slowdown
from hacfed.config_values import parse_set, split_host_port
from hacfed.envelope import load_public_key
from hacfed.flower_protocol import is_loopback_host
from hacfed.identity import PARTICIPANT_ID_RULE, is_participant_id
from hacfed.model_spec import check_model_spec
from hacfed.tomlfile import read_toml

DEFAULT_TASK = {"kind": "arithmetic", "digits": 2, "operators": "+"}


# The ParticipantConfig fields a lab sets in [participant] (and by flag); the rest keep their defaults.
PARTICIPANT_KEYS = ("participant_id", "model", "finetune", "device", "rollout_backend", "learning_rate", "lora_rank",
                    "eval_problems", "eval_split", "minibatch_size", "microbatch_tokens", "seed", "keep_checkpoints",
                    "nproc", "inbound_filter",
                    "outbound_filter", "deny_patterns", "deny_strings")
REQUIRED = ("participant_id", "model", "server", "state_dir", "coordinator_key")


@dataclass(frozen=True)
class ClientConfig:
    """participant: the lab's training choices (`ParticipantConfig`, which checks them), among them
    participant_id (this lab's id; its key is registered as `<participant_id>.pub`) and model (a preset
    such as tiny-llama, tiny-gpt2, tiny-qwen2 or smollm2, a local HF directory or a cached hub id).
    Its checkpoint_dir is set here to STATE/checkpoints.
    server: the coordinator's Fleet API HOST:PORT. state_dir: keys, checkpoints, reply cache, logs.
    coordinator_key: the coordinator's public key file. insecure / tls_ca: plaintext or TLS.
    stay: keep serving after the coordinator closed the run (default: exit 0 then).
    idle_poll_s: SuperNode poll interval.
    tensorboard: a directory for TensorBoard event files of every step's metrics; wandb: a W&B
    project for them (hacfed.metrics_sinks; the lab's own STATE/metrics.jsonl is always written).
    slowdown: each step takes this many times its compute time (>= 1; hacfed.clients.slowdown), to
    test labs of different speeds.

    Everything a user can get wrong is checked before hacfed-client creates any file, each value
    once: the training choices by ParticipantConfig; here what this process adds: that the id can
    be registered, that the model spec loads (`hacfed.model_spec`), the addresses, and that the key
    and CA files exist and parse."""

    participant: ParticipantConfig
    server: str
    state_dir: Path
    coordinator_key: Path
    insecure: bool = False
    tls_ca: Path | None = None
    stay: bool = False
    idle_poll_s: float = 0.5
    tensorboard: Path | None = None
    wandb: str | None = None
    slowdown: float = 1.0
    task: Mapping[str, Any] = field(default_factory=lambda: dict(DEFAULT_TASK))
    config_dir: Path | None = None  # task data paths resolve against it (default: current dir)

    @property
    def participant_id(self) -> str:
        return self.participant.participant_id

    @property
    def model(self) -> str:
        return self.participant.model

    def __post_init__(self) -> None:
        if not isinstance(self.participant, ParticipantConfig):
            _bad("participant", self.participant, "a ParticipantConfig")
        if not is_participant_id(self.participant_id):
            _bad("participant_id", self.participant_id, PARTICIPANT_ID_RULE)
        server_host, port = split_host_port(self.server, "ClientConfig.server")
        if port == 0:
            _bad("server", self.server, "the coordinator's HOST:PORT with a port in 1-65535")
        for name in ("state_dir", "coordinator_key", "tls_ca", "config_dir", "tensorboard"):
            value = getattr(self, name)
            if value is not None:
                if not isinstance(value, (str, Path)) or not str(value):
                    _bad(name, value, "a path")
                object.__setattr__(self, name, Path(value).expanduser().resolve())
        if not self.coordinator_key.is_file():
            what = "is a directory" if self.coordinator_key.is_dir() else "does not exist"
            raise ValueError(f"ClientConfig.coordinator_key: the file {str(self.coordinator_key)!r} {what}; give the "
                             "coordinator's public key file, coordinator.pub, which hacfed-server writes to its state "
                             "dir and names when it starts")
        try:
            load_public_key(self.coordinator_key)
        except ValueError as exc:
            _bad("coordinator_key", str(self.coordinator_key), f"the coordinator's public key file ({exc})")
        if self.state_dir.exists() and not self.state_dir.is_dir():
            _bad("state_dir", str(self.state_dir), "a directory (it is a file)")
        checkpoints = str(self.state_dir / "checkpoints")
        if self.participant.checkpoint_dir != checkpoints:
            object.__setattr__(self, "participant", replace(self.participant, checkpoint_dir=checkpoints))
        if not isinstance(self.insecure, bool) or self.insecure == (self.tls_ca is not None):
            _bad("insecure", self.insecure, "true without tls_ca (plaintext, --insecure) or false with --tls-ca FILE")
        if self.insecure and not is_loopback_host(server_host):
            _bad("insecure", self.insecure, f"false for the non-loopback server {self.server!r}: plaintext "
                 f"(--insecure) is a development mode for 127.0.0.1 only; pass --tls-ca with the federation's ca.pem")
        if self.tls_ca is not None:
            if not self.tls_ca.is_file():
                _bad("tls_ca", str(self.tls_ca), "an existing CA certificate file")
            check_ca_cert(self.tls_ca)  # expired, or not a CA: one clear line now, not a failed handshake later
        if not isinstance(self.stay, bool):
            _bad("stay", self.stay, "true or false")
        poll = self.idle_poll_s
        if isinstance(poll, bool) or not isinstance(poll, (int, float)) or not poll > 0:
            _bad("idle_poll_s", self.idle_poll_s, "a number > 0")
        self._check_metrics_sinks()
        try:
            object.__setattr__(self, "slowdown", check_slowdown(self.slowdown))
        except ValueError:
            _bad("slowdown", self.slowdown, "a finite number >= 1 and <= 100 (1: no slowdown)")
        if not isinstance(self.task, Mapping) or "kind" not in self.task:
            _bad("task", self.task, "a table with at least 'kind' (the coordinator's [task])")
        object.__setattr__(self, "task", dict(self.task))
        try:
            check_model_spec(self.model)
        except ValueError as exc:
            raise ValueError(f"ClientConfig.model: {exc}") from None

    def _check_metrics_sinks(self) -> None:
        from hacfed.metrics_sinks import require_tensorboard, require_wandb

        if self.tensorboard is not None:
            if self.tensorboard.exists() and not self.tensorboard.is_dir():
                _bad("tensorboard", str(self.tensorboard), "a directory for TensorBoard event files (it is a file)")
            require_tensorboard()
        if self.wandb is not None:
            if not isinstance(self.wandb, str) or not self.wandb.strip():
                _bad("wandb", self.wandb, "a W&B project name")
            require_wandb()


def check_server_name(server: str) -> None:
    """The coordinator's host name resolves: a name DNS says does not exist (a typo, or the README's
    placeholder coordinator.example) is refused in one line instead of retried as "unreachable"
    forever. A temporary resolver failure (EAI_AGAIN) passes: the SuperNode keeps retrying then."""
    import socket

    host, port = split_host_port(server, "--server")
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        if exc.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
            raise ValueError(f"--server {server}: the coordinator's host name {host!r} does not resolve "
                             f"({exc.strerror}); give the name or address hacfed-server runs on") from None


def _bad(name: str, value: object, requirement: str) -> None:
    raise ValueError(f"ClientConfig.{name} must be {requirement}, got {value!r}")


def setting_names() -> list[str]:
    """The keys of `[participant]` (and the flags' names): ClientConfig's own fields and PARTICIPANT_KEYS."""
    own = [f.name for f in fields(ClientConfig) if f.name not in ("participant", "task", "config_dir")]
    return sorted([*own, *PARTICIPANT_KEYS])


def load_client_config(
    path: str | Path | None = None, flags: Mapping[str, Any] | None = None, task_sets: Sequence[str] = ()
) -> ClientConfig:
    """`[participant]` and `[task]` of the TOML file (optional), then flags, then `--task` items."""
    table: dict[str, Any] = {}
    task: dict[str, Any] | None = None
    config_dir = None
    if path is not None:
        path = Path(path)
        data = read_toml(path)
        unknown_tables = sorted(set(data) - {"participant", "task"})
        if unknown_tables:
            raise ValueError(f"{path}: unknown table(s) {unknown_tables}; expected [participant] and [task]")
        for name in ("participant", "task"):
            if name in data and not isinstance(data[name], dict):
                raise ValueError(f"{path}: [{name}] must be a table, got {data[name]!r}")
        table = dict(data.get("participant", {}))
        task = dict(data["task"]) if "task" in data else None
        config_dir = path.resolve().parent
    known = setting_names()
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise ValueError(f"[participant]: unknown key(s) {unknown}; known: {known}")
    given = {k: v for k, v in (flags or {}).items() if v is not None}
    if given.get("tls_ca") is not None and "insecure" not in given:
        table.pop("insecure", None)  # --tls-ca on the command line replaces the file's plaintext setting
    if given.get("insecure") is True and "tls_ca" not in given:
        table.pop("tls_ca", None)  # --insecure replaces the file's TLS setting
    table.update(given)
    task = dict(DEFAULT_TASK) if task is None else task
    for item in task_sets:
        key, value = parse_set(item)
        task[key] = value
    missing = sorted(name for name in REQUIRED if name not in table)
    if missing:
        flags_named = ", ".join("--" + m.replace("_", "-") for m in missing)
        raise ValueError(f"missing setting(s) {missing}: pass {flags_named} or set them in [participant]")
    participant = ParticipantConfig(**{name: table.pop(name) for name in PARTICIPANT_KEYS if name in table})
    return ClientConfig(participant, **table, task=task, config_dir=config_dir)
