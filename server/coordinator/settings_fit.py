"""Whether the coordinator's settings fit its task and the message caps, checked before "ready".

Runs in hacfed-server's own process (`hacfed.server.runner.check_before_writing`), after the task
loads and before any file is created. `CoordinatorConfig` checks each setting on its own (an
integer >= 1, ...); what it cannot see without the task and the wire is checked here, so that a
setting no round could run under is refused in one line at start-up (exit 2) instead of failing at
the first round, or running an exchange that never ends:

- `prompts_per_round` at most the task's train problems (each round plans that many distinct ones);
- a full submission, `prompts_per_round` x `group_size` samples, within `max_submission_bytes`
  even at its smallest: each sample carries its prompt's text, so it is at least that many bytes
  plus `MIN_SAMPLE_BYTES` of ids and numbers (an empty response);
- `max_submission_bytes` at most the wire's per-message cap (`MAX_MESSAGE_BYTES`): no submission
  above the cap can arrive;
- `sampling.max_new_tokens` at most `max_response_chars`: a response of more tokens than that
  many characters would be refused (a token decodes to at least one character in practice).
"""

from __future__ import annotations

from hacfed.server.coordinator.config import CoordinatorConfig
from hacfed.tasks.base import Task
from hacfed.wire.types import MAX_MESSAGE_BYTES

MIN_SAMPLE_BYTES = 64  # a sample's ids, source, numbers and framing on the wire, below what any encoding takes


def check_settings_fit(cfg: CoordinatorConfig, task: Task) -> None:
    """Raise ValueError in one line naming the first setting that cannot fit `task` or the caps."""
    train = task.train_problems()
    if cfg.prompts_per_round > len(train):
        raise ValueError(f"prompts_per_round = {cfg.prompts_per_round}: exceeds the task's {len(train)} train "
                         f"problems; set it to at most {len(train)}")
    if cfg.max_submission_bytes > MAX_MESSAGE_BYTES:
        raise ValueError(f"max_submission_bytes = {cfg.max_submission_bytes}: exceeds the per-message cap of "
                         f"{MAX_MESSAGE_BYTES} bytes; set it to at most that")
    if cfg.sampling.max_new_tokens > cfg.max_response_chars:
        raise ValueError(f"sampling.max_new_tokens = {cfg.sampling.max_new_tokens}: more than max_response_chars "
                         f"({cfg.max_response_chars}), which refuses a longer response; lower it or raise "
                         f"max_response_chars")
    smallest = min(sum(len(m.content.encode("utf-8")) for m in p.messages) for p in train) + MIN_SAMPLE_BYTES
    samples = cfg.prompts_per_round * cfg.group_size
    if samples * smallest > cfg.max_submission_bytes:
        most = cfg.max_submission_bytes // (cfg.prompts_per_round * smallest)
        if most < 1:
            raise ValueError(f"prompts_per_round = {cfg.prompts_per_round}: a full submission of at least "
                             f"{cfg.prompts_per_round} samples of at least {smallest} bytes each exceeds "
                             f"max_submission_bytes ({cfg.max_submission_bytes}); lower it")
        raise ValueError(f"group_size = {cfg.group_size}: a full submission of prompts_per_round x group_size = "
                         f"{samples} samples of at least {smallest} bytes each exceeds max_submission_bytes "
                         f"({cfg.max_submission_bytes}); set group_size to at most {most}")
