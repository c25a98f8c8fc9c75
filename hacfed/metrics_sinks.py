"""Where per-round metrics rows go besides the console: JSON Lines, TensorBoard, Weights & Biases.

    logger = open_logger(jsonl=state / "metrics.jsonl", tensorboard_dir=Path("tb/lab-a"))
    logger.write({"round": 3, "agent": "lab-a", "reward_mean": 0.4, "train/loss": 0.1})
    logger.close()

A row is the metrics row of docs/experiments.md ("The metrics file (JSON Lines)"); TensorBoard and W&B get every
numeric value under the row's own key (`reward_mean`, `train/loss`, `train/cross/lab-b/ratio_p50`)
at step = `round`, so a tag means exactly what the JSONL key means. `seed` (constant) and `round`
(the step) are not scalars; strings and booleans (`agent`, `mode`, `final`) are not either.

TensorBoard needs the `tensorboard` package (`pip install 'hacfed[tensorboard]'`), W&B the `wandb`
package, which hacfed does not install; both are checked when the flag is parsed (`require_*`), so
a missing package is one line before anything starts. W&B is configured by its own environment
variables (`WANDB_MODE=offline`, `WANDB_DIR`, `WANDB_API_KEY`): hacfed passes only the project and
the run name.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

NOT_SCALARS = frozenset({"round", "seed"})


class MissingPackage(ValueError):
    """A flag needs an optional package that is not installed."""


def scalar_items(row: Mapping[str, Any]) -> dict[str, float]:
    """The row's numeric values by key (see the module docstring for what is left out)."""
    out = {}
    for key, value in row.items():
        if key in NOT_SCALARS or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(value):
            out[key] = float(value)
    return out


def require_tensorboard(flag: str = "--tensorboard") -> None:
    if importlib.util.find_spec("tensorboard") is None:
        raise MissingPackage(f"{flag} needs the tensorboard package, which is not installed: "
                             f"pip install 'hacfed[tensorboard]' (or pip install tensorboard)")


def require_wandb(flag: str = "--wandb") -> None:
    if importlib.util.find_spec("wandb") is None:
        raise MissingPackage(f"{flag} needs the wandb package, which hacfed does not install: pip install wandb "
                             f"(set WANDB_MODE=offline to log without an account)")


class Sink(Protocol):
    def write(self, row: Mapping[str, Any]) -> None: ...
    def close(self) -> None: ...


class JsonlSink:
    """Appends rows (a restarted writer appends the rounds it redoes; readers keep the last row of a round)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, row: Mapping[str, Any]) -> None:
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(dict(row), sort_keys=True) + "\n")

    def close(self) -> None:
        pass


class TensorBoardSink:
    def __init__(self, log_dir: Path) -> None:
        require_tensorboard()
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir))

    def write(self, row: Mapping[str, Any]) -> None:
        step = int(row.get("round", 0))
        for key, value in scalar_items(row).items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()  # a round is minutes apart: TensorBoard shows it now, and a kill loses nothing

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    def __init__(self, project: str, run_name: str | None, config: Mapping[str, Any] | None = None) -> None:
        require_wandb()
        import wandb

        self.wandb = wandb
        self.run = wandb.init(project=project, name=run_name, config=dict(config or {}))

    def write(self, row: Mapping[str, Any]) -> None:
        self.run.log(scalar_items(row), step=int(row.get("round", 0)))

    def close(self) -> None:
        self.run.finish()


class MetricsLogger:
    """Writes each row to every sink; a sink that fails is reported by its caller, not retried."""

    def __init__(self, sinks: Sequence[Sink]) -> None:
        self.sinks = list(sinks)

    def write(self, row: Mapping[str, Any]) -> None:
        for sink in self.sinks:
            sink.write(row)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def open_logger(*, jsonl: Path | None = None, tensorboard_dir: Path | None = None, wandb_project: str | None = None,
                run_name: str | None = None, config: Mapping[str, Any] | None = None) -> MetricsLogger:
    sinks: list[Sink] = []
    if jsonl is not None:
        sinks.append(JsonlSink(jsonl))
    if tensorboard_dir is not None:
        sinks.append(TensorBoardSink(tensorboard_dir))
    if wandb_project is not None:
        sinks.append(WandbSink(wandb_project, run_name, config))
    return MetricsLogger(sinks)


def step_row(participant_id: str, round_id: int, mode: str, seed: int, metrics: Mapping[str, float],
             eval_accuracy: float | None, final: bool) -> dict[str, Any]:
    """A lab's own row for one step, in the coordinator's row format (server/reporting.py): its
    report's metrics under `train/`, `reward_mean` (the mean reward it claimed, which the coordinator
    re-verifies) and `eval_accuracy` / `eval_pass1` when it evaluated. What only the coordinator knows
    (accepted, rejected, capability) is not in it."""
    row: dict[str, Any] = {"round": round_id, "agent": participant_id, "mode": mode, "seed": seed}
    if final:
        row["final"] = True
    elif metrics.get("reward_mean") is not None:
        row["reward_mean"] = metrics["reward_mean"]
    if eval_accuracy is not None:
        row["eval_accuracy"] = eval_accuracy
        if "eval_pass1" in metrics:
            row["eval_pass1"] = metrics["eval_pass1"]
    row.update({f"train/{k}": v for k, v in metrics.items()})
    return row

