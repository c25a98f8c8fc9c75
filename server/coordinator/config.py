"""The coordinator's typed configuration: every setting that must agree across organizations
(docs/style.md rule 5) plus the coordinator's own reliability limits. Network and TLS options belong to
the server command line, not here.

Read by hacfed-server (`hacfed.server.config`), by the round driver in the ServerApp process, and
by `hacfed sim`.

    cfg = load_coordinator_config("deploy/coordinator.toml").with_overrides({"rounds": 3})

TOML layout (nested tables for the nested settings):

    run_id = "demo"
    rounds = 20
    prompts_per_round = 8
    group_size = 8
    expected_participants = 2
    min_participants = 2
    round_deadline_s = 600
    state_dir = "state/coordinator"
    answer_keys = "coordinator"   # labs get questions only (the default: "public", development)
    [task]          # passed as-is to hacfed.tasks.registry.load_task
    kind = "arithmetic"    # or "plugin" with plugin = "NAME": an installed task package's reward
                           # (hacfed.tasks.plugin), with its own tables such as [task.sandbox]
    [sampling]      # hacfed.messages.SamplingParams; a setting left out is the task's own
    max_new_tokens = 16    # (hacfed.tasks.registry.task_sampling_defaults: gsm8k 256), else the default
    [hacpo]         # hacfed.hacpo_config.HacpoConfig
    mode = "hacpo"
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from hacfed.hacpo_config import HacpoConfig
from hacfed.messages import ANSWER_KEYS, PEER_CHOICES, ROUND_JOINS, SamplingParams
from hacfed.tasks.registry import task_sampling_defaults
from hacfed.tomlfile import read_toml

_RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_NESTED = ("task", "sampling", "hacpo")
# Settings that decide the prompt plans and the objective: a journal written under other values
# belongs to a different experiment, so the coordinator refuses to resume it (see Journal.bind_run).
MAX_VERIFY_THREADS = 8
MAX_VERIFY_BUDGET_S = 600.0
PLAN_FIELDS = ("run_id", "task", "seed", "prompts_per_round", "group_size", "sampling", "hacpo", "eval_every")


@dataclass(frozen=True)
class CoordinatorConfig:
    """Validated at construction; every error names the field and the offending value.

    expected_participants: how many labs the round waits for before closing early.
    min_participants: quorum; a round whose deadline passes with fewer contributors (participants
      with at least one accepted group) is extended up to `max_deadline_extensions` times, then
      closed with what it has (logged as below quorum).
    round_deadline_s: wall-clock seconds from opening a round to its deadline.
    eval_every: plans of rounds 0, k, 2k, ... ask participants to evaluate; 0 disables.
    max_strikes / strike_window_rounds: K reward mismatches within the last W rounds quarantine a
      participant.
    min_mean_logp: lower bound on a trajectory's per-token mean log-prob (-L_max, security.md T3).
    rate_limit_per_s / rate_limit_burst: each participant's token bucket of submission attempts.
    round_quota_bytes / round_quota_trajectories: what one participant may send per round, accepted
      or not (default: 4 full submissions' worth); see hacfed.server.coordinator.limits.
    pool_peers_per_prompt: each lab is sent its own accepted samples and, per prompt, the groups of
      at most this many other labs (hacfed.server.coordinator.pool_share); with at most K + 1 labs
      every lab gets the whole pool.
    pool_peer_choice: which K peers, where a prompt has more: "drawn" (a keyed hash, each peer
      equally likely) or "successes" (the K groups with the most verified reward, ties drawn).
    answer_keys: who holds the task's answers (docs/design.md, "Answer keys"). "public" (the default
      here, for development: `hacfed sim`, `hacfed demo`, tests): every lab loads the task with its
      answers, claims each sample's reward and the coordinator re-verifies it (a false claim is a
      strike). "coordinator" (deploy/coordinator.toml): the plan says so, labs claim nothing, every
      sample is scored here alone and its verified reward reaches its lab with the next pool; no
      strikes for rewards, since there are no claims.
    dedup_successes: a success counts once (docs/security.md, "Duplicate successes count once"):
      off (the default here: P̂ exactly as docs/hacpo.md §2 defines it), or on (deploy/coordinator.toml):
      for P̂ and the `successes` choice a repeated text in a group, or a text first accepted from
      another lab for the prompt, is credited 0 (hacfed.server.coordinator.success_credit).
    format_gate: off (the default here: P̂ and the `successes` choice as before), or on
      (deploy/coordinator.toml): when a sample of a lab's group for a prompt does not fit the task's
      response format (hacfed.response_format, the check of a lab's inbound filter, which leaves such
      a group out whole), every success of the group is credited 0 for P̂ and the `successes` choice
      ranks the group last (docs/security.md, "Inbound checks on peer text"). Composes with
      dedup_successes.
    verify_threads: threads that re-verify one submission's rewards (1-8): with a task whose
      verifier is a pool of sandboxed workers (math-verify, `parallel_workers`), more than 1 keeps the
      workers busy while the rest is screened in process (a task with `start_verify_batch`, such as GSM8K,
      then verifies the submission as one batch: one thread screening, a helper per worker); a pure
      in-process verifier gains nothing from more than 1 (hacfed.server.coordinator.validation).
    verify_budget_s: the most seconds one submission's reward verification may take (time its own
      samples cost: sandboxed worker requests or in-process checks, not waiting behind another
      submission's). Past it nothing more of it is verified and it is refused with
      HACFED-E-VERIFY-BUDGET, a strike (hacfed.tasks.verify_budget). The default, 20 s, is four of
      math-verify's 5 s per-sample timeouts and far above an honest GSM8K submission's cost (docs/results.md).
    max_staleness: K, how many rounds a lab may run ahead of the slowest one (docs/staleness.md). 0
      (the default) is the synchronous federation: one round open at a time, every lab trains on the
      whole pool of the round before. With K >= 1 up to K + 1 rounds are open at once, a lab trains on
      whatever verified samples of the last K + 1 rounds it has not trained on yet, and no sample is
      older than K rounds when trained on (hacfed.server.coordinator.engine). Per-round quotas
      default to K + 1 times as much (submissions of K + 1 rounds count against the newest open one).
    round_join: which round a lab rolls out when it starts a step (docs/staleness.md). "every" (the
      default): every lab rolls out every round. "newest": it joins the newest open round it has not
      rolled out, or opens the next one (under the max_staleness bound), so a slow lab skips the
      rounds opened while it was busy and a round waits only for the labs that took it
      (hacfed.server.coordinator.engine).
    """

    run_id: str
    task: Mapping[str, Any]
    rounds: int
    prompts_per_round: int
    group_size: int
    expected_participants: int
    min_participants: int
    round_deadline_s: float
    state_dir: Path
    sampling: SamplingParams = field(default_factory=SamplingParams)
    hacpo: HacpoConfig = field(default_factory=HacpoConfig)
    eval_every: int = 5
    seed: int = 0
    max_strikes: int = 3
    strike_window_rounds: int = 10
    max_deadline_extensions: int = 1
    max_response_chars: int = 16384
    max_submission_bytes: int = 16 * 1024 * 1024
    min_mean_logp: float = -50.0
    rate_limit_per_s: float = 0.5
    rate_limit_burst: int = 8
    round_quota_bytes: int | None = None
    round_quota_trajectories: int | None = None
    pool_peers_per_prompt: int = 7
    pool_peer_choice: str = "drawn"
    verify_threads: int = 2
    verify_budget_s: float = 20.0
    answer_keys: str = "public"
    dedup_successes: bool = False
    format_gate: bool = False
    max_staleness: int = 0
    round_join: str = "every"

    def __post_init__(self) -> None:
        if not isinstance(self.run_id, str) or not _RUN_ID_RE.fullmatch(self.run_id):
            _bad("run_id", self.run_id, "1-64 characters of [A-Za-z0-9._-], starting alphanumeric")
        if not isinstance(self.task, Mapping) or not self.task:
            _bad("task", self.task, "a non-empty table (passed to hacfed.tasks.registry.load_task)")
        # A private read-only copy: nobody can mutate the task spec after validation.
        object.__setattr__(self, "task", MappingProxyType(copy.deepcopy(dict(self.task))))
        _int(self, "rounds", 1)
        _int(self, "prompts_per_round", 1)
        _int(self, "group_size", 1)
        _int(self, "expected_participants", 1)
        _int(self, "min_participants", 1)
        if self.min_participants > self.expected_participants:
            _bad("min_participants", self.min_participants, f"<= expected_participants ({self.expected_participants})")
        _number(self, "round_deadline_s", lambda v: v > 0, "> 0")
        if isinstance(self.state_dir, str) and self.state_dir:
            object.__setattr__(self, "state_dir", Path(self.state_dir))
        if not isinstance(self.state_dir, Path):
            _bad("state_dir", self.state_dir, "a non-empty path")
        if not isinstance(self.sampling, SamplingParams):
            _bad("sampling", self.sampling, "a SamplingParams")
        if not isinstance(self.hacpo, HacpoConfig):
            _bad("hacpo", self.hacpo, "a HacpoConfig")
        _int(self, "eval_every", 0)
        _int(self, "seed", 0)
        _int(self, "max_strikes", 1)
        _int(self, "strike_window_rounds", 1)
        _int(self, "max_deadline_extensions", 0)
        _int(self, "max_response_chars", 1)
        _int(self, "max_submission_bytes", 1024)
        _number(self, "min_mean_logp", lambda v: v < 0, "< 0")
        _number(self, "rate_limit_per_s", lambda v: v > 0, "> 0")
        _int(self, "rate_limit_burst", 1)
        if self.round_quota_bytes is not None:
            _int(self, "round_quota_bytes", 1024)
        if self.round_quota_trajectories is not None:
            _int(self, "round_quota_trajectories", self.prompts_per_round * self.group_size)
        _int(self, "pool_peers_per_prompt", 1)
        if self.pool_peer_choice not in PEER_CHOICES:
            _bad("pool_peer_choice", self.pool_peer_choice, f"one of {', '.join(map(repr, PEER_CHOICES))}")
        _int(self, "verify_threads", 1)
        _number(self, "verify_budget_s", lambda v: 0 < v <= MAX_VERIFY_BUDGET_S, f"in (0, {MAX_VERIFY_BUDGET_S}]")
        if self.verify_threads > MAX_VERIFY_THREADS:
            _bad("verify_threads", self.verify_threads, f"an integer in [1, {MAX_VERIFY_THREADS}]")
        if self.answer_keys not in ANSWER_KEYS:
            _bad("answer_keys", self.answer_keys, f"one of {', '.join(map(repr, ANSWER_KEYS))}")
        if not isinstance(self.dedup_successes, bool):
            _bad("dedup_successes", self.dedup_successes, "true or false")
        if not isinstance(self.format_gate, bool):
            _bad("format_gate", self.format_gate, "true or false")
        _int(self, "max_staleness", 0)
        if self.round_join not in ROUND_JOINS:
            _bad("round_join", self.round_join, f"one of {', '.join(map(repr, ROUND_JOINS))}")

    @property
    def quota_bytes(self) -> int:
        """Bytes one participant may send per round (round_quota_bytes, default 4 full submissions)."""
        if self.round_quota_bytes is not None:
            return self.round_quota_bytes
        return 4 * (self.max_staleness + 1) * self.max_submission_bytes

    @property
    def quota_trajectories(self) -> int:
        """Trajectories one participant may send per round (default 4 full submissions)."""
        if self.round_quota_trajectories is not None:
            return self.round_quota_trajectories
        return 4 * (self.max_staleness + 1) * self.prompts_per_round * self.group_size

    @property
    def journal_path(self) -> Path:
        return self.state_dir / "journal.sqlite"

    @property
    def audit_path(self) -> Path:
        """The hash-chained audit log (hacfed.server.coordinator.audit)."""
        return self.state_dir / "audit.log"

    def to_dict(self) -> dict[str, Any]:
        """Plain TOML/JSON-able values; `from_mapping(cfg.to_dict()) == cfg`."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "task":
                value = copy.deepcopy(dict(value))
            elif f.name == "sampling":
                value = asdict(value)
            elif f.name == "hacpo":
                value = value.to_dict()
            elif f.name == "state_dir":
                value = str(value)
            elif value is None:
                continue  # an unset optional setting: TOML has no null, and from_mapping defaults it
            out[f.name] = value
        return out

    def plan_fingerprint(self) -> dict[str, Any]:
        """The settings a journal is bound to (PLAN_FIELDS), as plain values."""
        full = self.to_dict()
        bound = {name: full[name] for name in PLAN_FIELDS}
        if self.answer_keys != "public":  # a journal from before the setting existed was "public"
            bound["answer_keys"] = self.answer_keys
        if self.dedup_successes:  # off binds a journal as before the setting existed
            bound["dedup_successes"] = True
        if self.format_gate:  # off binds a journal as before the setting existed
            bound["format_gate"] = True
        if self.max_staleness:  # 0 (synchronous) binds a journal as before the setting existed
            bound["max_staleness"] = self.max_staleness
        if self.round_join != "every":  # the default binds a journal as before the setting existed
            bound["round_join"] = self.round_join
        return bound

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "CoordinatorConfig":
        """Build from a parsed TOML table: nested tables for task, sampling and hacpo."""
        if not isinstance(data, Mapping):
            raise ValueError(f"coordinator config must be a table, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown coordinator config key(s): {unknown}; known: {sorted(known)}")
        required = sorted(f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING)
        missing = [name for name in required if name not in data]
        if missing:
            raise ValueError(f"coordinator config is missing required key(s): {missing}")
        kwargs = dict(data)
        task_sampling = task_sampling_defaults(kwargs.get("task"))  # e.g. gsm8k's budget, unless [sampling] says
        if task_sampling and isinstance(kwargs.get("sampling", {}), Mapping):
            kwargs["sampling"] = {**task_sampling, **kwargs.get("sampling", {})}
        if "sampling" in kwargs:
            kwargs["sampling"] = _nested(SamplingParams, "sampling", kwargs["sampling"])
        if "hacpo" in kwargs:
            table = kwargs["hacpo"]
            if not isinstance(table, Mapping):
                _bad("hacpo", table, "a table")
            kwargs["hacpo"] = HacpoConfig.from_dict(dict(table))
        return cls(**kwargs)

    def with_overrides(self, overrides: Mapping[str, Any]) -> "CoordinatorConfig":
        """A copy with some settings replaced, re-validated. Keys are field names, dotted paths into
        the nested tables (`"sampling.max_new_tokens"`, `"task.sandbox.timeout_s"`), or nested
        mappings merged into them."""
        return CoordinatorConfig.from_mapping(apply_overrides(self.to_dict(), overrides))


def apply_overrides(table: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a coordinator table with `overrides` applied (see `with_overrides`), not yet
    validated: the caller builds the config from it once."""
    data = dict(table)
    for key, value in overrides.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"override keys must be non-empty strings, got {key!r}")
        head, _, rest = key.partition(".")
        if rest:
            if head not in _NESTED:
                raise ValueError(f"override {key!r}: only {list(_NESTED)} have nested settings")
            data[head] = _with_path(_table(data, head), rest.split("."), value)
        elif head in _NESTED and isinstance(value, Mapping) and head != "task":
            data[head] = {**_table(data, head), **value}
        else:
            data[head] = value
    return data


def load_coordinator_config(path: str | Path, overrides: Mapping[str, Any] | None = None) -> CoordinatorConfig:
    """Parse a TOML file; a top-level `[coordinator]` table is used if present, else the whole file."""
    data = read_toml(path, "coordinator config file")
    table = data.get("coordinator", data)
    return CoordinatorConfig.from_mapping(apply_overrides(table, overrides or {}))


def _table(data: Mapping[str, Any], head: str) -> Mapping[str, Any]:
    inner = data.get(head, {})
    if not isinstance(inner, Mapping):
        _bad(head, inner, "a table")
    return inner


def _with_path(table: Mapping[str, Any], path: list[str], value: Any) -> dict[str, Any]:
    """A copy of `table` with `value` at the nested `path` (tables on the way are copied or made)."""
    head, rest = path[0], path[1:]
    if not rest:
        return {**table, head: value}
    inner = table.get(head, {})
    if not isinstance(inner, Mapping):
        raise ValueError(f"override {'.'.join(path)!r}: {head!r} is {inner!r}, not a table")
    return {**table, head: _with_path(inner, rest, value)}


def _nested(cls: type, name: str, table: Any) -> Any:
    if isinstance(table, cls):
        return table
    if not isinstance(table, Mapping):
        _bad(name, table, "a table")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(table) - known)
    if unknown:
        raise ValueError(f"CoordinatorConfig.{name}: unknown key(s) {unknown}; known: {sorted(known)}")
    return cls(**table)


def _bad(name: str, value: object, requirement: str) -> None:
    raise ValueError(f"CoordinatorConfig.{name} must be {requirement}, got {value!r}")


def _int(cfg: CoordinatorConfig, name: str, minimum: int) -> None:
    value = getattr(cfg, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        _bad(name, value, f"an integer >= {minimum}")


def _number(cfg: CoordinatorConfig, name: str, ok: Any, requirement: str) -> None:
    value = getattr(cfg, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not ok(value):
        _bad(name, value, f"a finite number {requirement}")
    object.__setattr__(cfg, name, float(value))
