"""The hacfed coordinator: transport-independent, torch-free round logic and its SQLite journal.

    from hacfed.coordinator import Coordinator, Journal, load_coordinator_config, run_rounds

Modules: `config` (CoordinatorConfig), `plan` (deterministic prompt plans), `validation` (pure
submission checks and reward re-verification), `errors` (the closed set of HACFED-E codes),
`journal` (SQLite, WAL, synchronous=FULL), `state` (the round state machine), `results`,
`metrics`, `transport` (the endpoint interface and the in-process loop).
"""

from hacfed.coordinator.config import CoordinatorConfig, load_coordinator_config
from hacfed.coordinator.errors import GRPC_STATUS, STRIKE_CODES, CoordinatorStateError, ErrorCode, JournalError
from hacfed.coordinator.journal import Journal, ParticipantRecord, RoundRecord
from hacfed.coordinator.metrics import ParticipantRoundMetrics, RoundSummary, append_jsonl
from hacfed.coordinator.plan import make_plan, plan_from_dict, plan_to_dict
from hacfed.coordinator.results import Receipt, ResumeReport, RoundClosed, SubmissionResult
from hacfed.coordinator.state import Coordinator
from hacfed.coordinator.transport import ParticipantEndpoint, RoundOutcome, run_rounds
from hacfed.coordinator.validation import Rejection, ValidationLimits, submission_digest, validate_submission


def load_task_from_config(cfg: CoordinatorConfig, base_dir: str | None = None):
    """The task described by `cfg.task`, through `hacfed.tasks.registry.load_task` (imported
    lazily); relative data paths resolve against `base_dir` (e.g. the config file's folder)."""
    from hacfed.tasks.registry import load_task

    return load_task(dict(cfg.task), base_dir=base_dir)


__all__ = [
    "Coordinator", "CoordinatorConfig", "CoordinatorStateError", "ErrorCode", "GRPC_STATUS", "Journal",
    "JournalError", "ParticipantEndpoint", "ParticipantRecord", "ParticipantRoundMetrics", "Receipt", "Rejection",
    "ResumeReport", "RoundClosed", "RoundOutcome", "RoundRecord", "RoundSummary", "STRIKE_CODES",
    "SubmissionResult", "ValidationLimits", "append_jsonl", "load_coordinator_config", "load_task_from_config",
    "make_plan", "plan_from_dict", "plan_to_dict", "run_rounds", "submission_digest", "validate_submission",
]
