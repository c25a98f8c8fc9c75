"""The matrix of a modes benchmark: settings × modes × seeds, read from TOML and validated.

    hacfed bench modes --matrix bench/modes.toml --out runs/modes

`[defaults]` holds every run setting (task, rounds, lr, ...); each `[settings.NAME]` table names its
agents and may override any default; optional `[[comparisons]]` pair one agent and mode across two
settings. Every key is required somewhere (no hidden defaults) except `minibatch_size` (absent: the
paper's prompts × G / 2, as `hacfed sim` without --minibatch-size), `peers_per_prompt` (absent: the
coordinator's K, as `hacfed sim` without --peers-per-prompt), `peer_choice` (absent: the coordinator's,
"drawn"), `finetune` (absent: `hacfed sim`'s "auto", LoRA above 300M parameters), `eval_sampled`
(absent: true, each evaluation also scores one temperature-1 sample per problem), `eval_start`
(absent: true; false skips the round-0 evaluation, which is the loaded model's in every run),
`text_filter` (absent: true, `hacfed sim`'s default: each honest lab's text filter checks peers' text),
`deny` (absent: none; a list of known canaries, `hacfed sim --deny` each), `temperature` (absent:
`hacfed sim`'s 1), `max_new_tokens` (absent: the task's own budget) and a setting's
`archived` (absent: false; true keeps an earlier design in the report without rerunning it), and
unknown keys are errors, so a typo never silently runs the wrong experiment. Errors are
`MatrixError`s naming the file, table and key.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hacfed.messages import ANSWER_KEYS, PEER_CHOICES, ROUND_JOINS
from hacfed.tomlfile import read_toml
from hacfed.tools import hostile
from hacfed.tools.modes import get_mode
from hacfed.tools.sim import SIM_MODES, TASKS, participant_ids

# Keys of [defaults], each also allowed in a setting's table.
RUN_KEYS = ("task", "rounds", "lr", "eval_every", "eval_problems", "eval_split", "prompts_per_round",
            "group_size", "seeds", "modes", "baseline")
# Absent: `hacfed sim`'s default (minibatch: the paper's 2 updates per source; peers and their choice:
# the coordinator's).
OPTIONAL_RUN_KEYS = ("minibatch_size", "peers_per_prompt", "peer_choice", "finetune", "eval_sampled", "eval_start",
                     "text_filter", "answer_keys", "dedup_successes", "format_gate", "deny", "max_staleness",
                     "lab_speed", "round_join", "temperature", "max_new_tokens")
FINETUNES = ("auto", "full", "lora")  # hacfed sim --finetune
SETTING_ONLY_KEYS = ("agents", "description", "archived")
COMPARISON_KEYS = ("agent", "mode", "settings")
EVAL_SPLITS = ("test", "validation")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")  # a setting name is also a directory name


class MatrixError(ValueError):
    """A matrix file that cannot be run: the message names the file, table and key."""


@dataclass(frozen=True)
class RunSettings:
    """What every run of one setting shares (the `hacfed sim` options), after defaults are applied."""

    task: str
    rounds: int
    lr: float
    eval_every: int
    eval_problems: int
    eval_split: str
    prompts_per_round: int
    group_size: int
    seeds: tuple[int, ...]
    modes: tuple[str, ...]
    baseline: str
    minibatch_size: int | None = None
    peers_per_prompt: int | None = None
    peer_choice: str | None = None
    finetune: str | None = None
    eval_sampled: bool = True
    eval_start: bool = True
    text_filter: bool = True
    answer_keys: str | None = None  # None: hacfed sim's default ("public")
    dedup_successes: bool = False
    format_gate: bool = False  # hacfed sim --format-gate
    deny: tuple[str, ...] = ()  # hacfed sim --deny TEXT: known canaries every honest lab's filter drops
    max_staleness: int = 0  # hacfed sim --max-staleness (docs/staleness.md)
    lab_speed: tuple[str, ...] = ()  # hacfed sim --lab-speed AGENT=FACTOR, each checked by hacfed sim
    round_join: str = "every"  # hacfed sim --round-join (docs/staleness.md)
    temperature: float | None = None  # hacfed sim --temperature; None: its default 1
    max_new_tokens: int | None = None  # hacfed sim --max-new-tokens; None: the task's budget

    def rollouts_per_agent_per_round(self, mode: str) -> int:
        """Responses one agent samples per round: prompts × G, × 2 for gspo2 (its cost)."""
        return self.prompts_per_round * self.group_size * get_mode(mode).rollout_multiplier


@dataclass(frozen=True)
class Setting:
    name: str
    agents: tuple[str, ...]  # model specs, as `hacfed sim --agents` takes them
    description: str
    run: RunSettings
    # An earlier design kept for the record: the report covers it (its runs on disk, or its earlier
    # block), but `hacfed bench modes` runs it only when --only names it.
    archived: bool = False

    @property
    def agent_ids(self) -> tuple[str, ...]:
        """The participant ids the metrics rows carry (a model listed twice gets a suffix)."""
        return tuple(participant_ids(self.agents))

    @property
    def evaluated_ids(self) -> tuple[str, ...]:
        """The agents whose runs end with a final evaluation row (a scripted hostile lab has none)."""
        return tuple(pid for pid, spec in zip(self.agent_ids, self.agents) if hostile.evaluates(spec))


@dataclass(frozen=True)
class Comparison:
    """One agent and mode in two settings, paired by seed: settings[0] − settings[1]."""

    agent: str
    mode: str
    settings: tuple[str, str]


@dataclass(frozen=True)
class Matrix:
    path: Path
    settings: tuple[Setting, ...]
    comparisons: tuple[Comparison, ...]

    def setting(self, name: str) -> Setting:
        for s in self.settings:
            if s.name == name:
                return s
        raise MatrixError(f"{self.path}: no setting {name!r}; settings: {', '.join(self.names)}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.settings)


def load_matrix(path: str | Path) -> Matrix:
    path = Path(path)
    try:
        data = read_toml(path, "matrix file")
    except ValueError as exc:
        raise MatrixError(str(exc)) from None
    return parse_matrix(data, path)


def parse_matrix(data: dict[str, Any], path: Path) -> Matrix:
    """Validate a parsed TOML document into a `Matrix` (errors name `path` and the key)."""
    where = str(path)
    _only_keys(data, ("defaults", "settings", "comparisons"), where)
    defaults = _table(data.get("defaults", {}), f"{where}: [defaults]")
    _only_keys(defaults, RUN_KEYS + OPTIONAL_RUN_KEYS, f"{where}: [defaults]")
    raw_settings = _table(data.get("settings"), f"{where}: [settings]")
    if not raw_settings:
        raise MatrixError(f"{where}: no [settings.NAME] table; at least one setting is needed")
    settings = tuple(_parse_setting(name, raw, defaults, where) for name, raw in raw_settings.items())
    raw_comparisons = data.get("comparisons", [])
    if not isinstance(raw_comparisons, list):
        raise MatrixError(f"{where}: comparisons must be an array of tables ([[comparisons]])")
    matrix = Matrix(path, settings, ())
    comparisons = tuple(_parse_comparison(raw, i, matrix, where) for i, raw in enumerate(raw_comparisons))
    return Matrix(path, settings, comparisons)


def _parse_setting(name: str, raw: Any, defaults: dict[str, Any], where: str) -> Setting:
    table = f"{where}: [settings.{name}]"
    if not _NAME.match(name):
        raise MatrixError(f"{table}: a setting name must be letters, digits, '-' or '_' (it names a directory)")
    raw = _table(raw, table)
    _only_keys(raw, RUN_KEYS + OPTIONAL_RUN_KEYS + SETTING_ONLY_KEYS, table)
    merged = {**defaults, **raw}
    missing = [k for k in RUN_KEYS + ("agents",) if k not in merged]
    if missing:
        raise MatrixError(f"{table}: missing {', '.join(missing)} (set in [defaults] or in this table)")

    def origin(key: str) -> str:  # the table a bad value came from
        return table if key in raw else f"{where}: [defaults]"

    run = _run_settings(merged, origin)
    agents = _str_list(merged["agents"], table, "agents", unique=False)  # sim suffixes a repeated model
    if any("," in a or not a.strip() for a in agents):
        raise MatrixError(f"{table}: agents must be non-empty model specs without commas, got {list(agents)!r}")
    description = merged.get("description", "")
    if not isinstance(description, str):
        raise MatrixError(f"{table}: description must be a string, got {description!r}")
    archived = _bool(merged.get("archived", False), table, "archived")
    return Setting(name, agents, description.strip(), run, archived)


def _run_settings(merged: dict[str, Any], origin: Callable[[str], str]) -> RunSettings:
    modes = _str_list(merged["modes"], origin("modes"), "modes")
    for mode in modes:
        if mode not in SIM_MODES:
            raise MatrixError(f"{origin('modes')}: modes: unknown mode {mode!r}; known: {', '.join(SIM_MODES)}")
    baseline = merged["baseline"]
    if baseline not in modes:
        raise MatrixError(f"{origin('baseline')}: baseline {baseline!r} is not one of the modes {list(modes)}")
    seeds = merged["seeds"]
    if (not isinstance(seeds, list) or not seeds or len(set(seeds)) != len(seeds)
            or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds)):
        raise MatrixError(f"{origin('seeds')}: seeds must be a non-empty list of distinct ints >= 0, got {seeds!r}")
    lr = merged["lr"]
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr < float("inf"):
        raise MatrixError(f"{origin('lr')}: lr must be a number > 0, got {lr!r}")

    def positive_int(key: str) -> int:
        value = merged[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise MatrixError(f"{origin(key)}: {key} must be an int >= 1, got {value!r}")
        return value

    return RunSettings(
        task=_choice(merged["task"], tuple(TASKS), origin("task"), "task"),
        rounds=positive_int("rounds"), lr=float(lr), eval_every=positive_int("eval_every"),
        eval_problems=positive_int("eval_problems"),
        eval_split=_choice(merged["eval_split"], EVAL_SPLITS, origin("eval_split"), "eval_split"),
        prompts_per_round=positive_int("prompts_per_round"), group_size=positive_int("group_size"),
        seeds=tuple(seeds), modes=modes, baseline=baseline,
        minibatch_size=positive_int("minibatch_size") if "minibatch_size" in merged else None,
        peers_per_prompt=positive_int("peers_per_prompt") if "peers_per_prompt" in merged else None,
        peer_choice=(_choice(merged["peer_choice"], PEER_CHOICES, origin("peer_choice"), "peer_choice")
                     if "peer_choice" in merged else None),
        finetune=(_choice(merged["finetune"], FINETUNES, origin("finetune"), "finetune")
                  if "finetune" in merged else None),
        eval_sampled=_bool(merged.get("eval_sampled", True), origin("eval_sampled"), "eval_sampled"),
        eval_start=_bool(merged.get("eval_start", True), origin("eval_start"), "eval_start"),
        text_filter=_bool(merged.get("text_filter", True), origin("text_filter"), "text_filter"),
        answer_keys=(_choice(merged["answer_keys"], ANSWER_KEYS, origin("answer_keys"), "answer_keys")
                     if "answer_keys" in merged else None),
        dedup_successes=_bool(merged.get("dedup_successes", False), origin("dedup_successes"), "dedup_successes"),
        format_gate=_bool(merged.get("format_gate", False), origin("format_gate"), "format_gate"),
        deny=_str_list(merged["deny"], origin("deny"), "deny") if "deny" in merged else (),
        max_staleness=_staleness(merged.get("max_staleness", 0), origin("max_staleness")),
        lab_speed=_str_list(merged["lab_speed"], origin("lab_speed"), "lab_speed") if "lab_speed" in merged else (),
        round_join=_choice(merged.get("round_join", "every"), ROUND_JOINS, origin("round_join"), "round_join"),
        temperature=_temperature(merged["temperature"], origin("temperature")) if "temperature" in merged else None,
        max_new_tokens=positive_int("max_new_tokens") if "max_new_tokens" in merged else None,
    )


def _temperature(value: Any, table: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise MatrixError(f"{table}: temperature must be a number > 0, got {value!r}")
    return float(value)


def _staleness(value: Any, table: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MatrixError(f"{table}: max_staleness must be an int >= 0, got {value!r}")
    return value


def _bool(value: Any, table: str, key: str) -> bool:
    if not isinstance(value, bool):
        raise MatrixError(f"{table}: {key} must be true or false, got {value!r}")
    return value


def _parse_comparison(raw: Any, index: int, matrix: Matrix, where: str) -> Comparison:
    table = f"{where}: [[comparisons]] #{index + 1}"
    raw = _table(raw, table)
    _only_keys(raw, COMPARISON_KEYS, table)
    missing = [k for k in COMPARISON_KEYS if k not in raw]
    if missing:
        raise MatrixError(f"{table}: missing {', '.join(missing)}")
    names = _str_list(raw["settings"], table, "settings", unique=False)
    if len(names) != 2 or names[0] == names[1]:
        raise MatrixError(f"{table}: settings must name two different settings, got {list(names)!r}")
    agent, mode = raw["agent"], raw["mode"]
    for name in names:
        if name not in matrix.names:
            raise MatrixError(f"{table}: settings: no setting {name!r}; settings: {', '.join(matrix.names)}")
        setting = matrix.setting(name)
        if agent not in setting.agent_ids:
            raise MatrixError(
                f"{table}: agent {agent!r} is not in setting {name!r} (agents: {', '.join(setting.agent_ids)})"
            )
        if mode not in setting.run.modes:
            raise MatrixError(
                f"{table}: mode {mode!r} is not run in setting {name!r} (modes: {', '.join(setting.run.modes)})"
            )
    return Comparison(agent, mode, (names[0], names[1]))


def _table(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise MatrixError(f"{where} must be a table, got {value!r}")
    return value


def _only_keys(table: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
    unknown = sorted(set(table) - set(allowed))
    if unknown:
        raise MatrixError(f"{where}: unknown key {unknown[0]!r}; allowed: {', '.join(allowed)}")


def _choice(value: Any, allowed: tuple[str, ...], where: str, key: str) -> str:
    if value not in allowed:
        raise MatrixError(f"{where}: {key} must be one of {', '.join(allowed)}, got {value!r}")
    return value


def _str_list(value: Any, where: str, key: str, unique: bool = True) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise MatrixError(f"{where}: {key} must be a non-empty list of strings, got {value!r}")
    if unique and len(set(value)) != len(value):
        raise MatrixError(f"{where}: {key} lists a value twice: {value!r}")
    return tuple(value)
