"""The hacfed coordinator: transport-independent, torch-free round logic and its SQLite journal.

Runs in the coordinator's ServerApp process (the Flower ServerApp that hacfed-server's SuperLink
starts, through `hacfed.server.driver`); hacfed-server opens the journal itself before it starts
anything, and `hacfed sim` runs the same coordinator in one process.

    from hacfed.server.coordinator import Coordinator, Journal, load_coordinator_config, run_rounds

Modules: `config` (CoordinatorConfig), `plan` (deterministic prompt plans), `validation` (pure
submission checks and reward re-verification), `errors` (the closed set of HACFED-E codes),
`journal` (SQLite, WAL, synchronous=FULL), `state` (the round state machine), `results`,
`metrics`, `transport` (the endpoint interface and the in-process loop).
"""

from hacfed.server.coordinator.config import CoordinatorConfig, load_coordinator_config
from hacfed.server.coordinator.errors import GRPC_STATUS, STRIKE_CODES, CoordinatorStateError, ErrorCode, JournalError
from hacfed.server.coordinator.journal import Journal, ParticipantRecord, RoundRecord
from hacfed.server.coordinator.metrics import ParticipantRoundMetrics, RoundSummary, append_jsonl
from hacfed.server.coordinator.plan import make_plan, plan_from_dict, plan_to_dict
from hacfed.server.coordinator.results import Receipt, ResumeReport, RoundClosed, RoundOutcome, SubmissionResult
from hacfed.server.coordinator.state import Coordinator
from hacfed.server.coordinator.transport import ParticipantEndpoint, run_rounds
from hacfed.server.coordinator.validation import Rejection, ValidationLimits, submission_digest, validate_submission


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
