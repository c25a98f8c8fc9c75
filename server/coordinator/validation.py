"""Pure checks of a participant's `Submission` against its round's plan (security.md T1, T3, T6, T8).

Runs in the coordinator's ServerApp process (the Flower ServerApp that hacfed-server's SuperLink
starts, through `hacfed.server.driver`) and, in-process, in `hacfed sim`.

Order: the cheap checks of every trajectory first (size, text, ids, identity, assignment, numbers,
log-prob range, policy version), then re-verification of rewards, only for groups that passed. The
costly verifier therefore never runs on a group that is already known to be unusable.

Groups are all-or-nothing. A planned prompt's group is accepted only if it holds exactly G samples
and every sample passes every check: GRPO/HACPO advantages are normalized within a group, so a group
with a sample removed would bias every other sample's advantage (and would let a participant drop
its failures to inflate its capability estimate). The invalid sample gets its own code; its valid
siblings get GROUP_REJECTED. A planned prompt with no sample at all is reported with trajectory id
None and INCOMPLETE_GROUP; the participant's other groups are still judged on their own.

Rewards are never taken from the participant: each is re-computed with the task's verifier
(`task.verify(task.problem(prompt_id), response_text).reward`). A claim that differs is a
REWARD_MISMATCH (a strike, see errors.STRIKE_CODES); accepted trajectories carry the verified reward.
Under a plan whose `answer_keys` is "coordinator" labs claim nothing: the claim is ignored, never a strike.

The samples of every group that passed the cheap checks are verified together, over
`ValidationLimits.verify_threads` threads (`reward_verification`); the verdicts, and so the
outcome, do not depend on the number of threads. Their verification may take at most
`ValidationLimits.verify_budget_s` seconds: past it the whole submission is refused with
VERIFY_BUDGET (one strike, whose trajectory id is None) and nothing of it is accepted.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass
from typing import Any, Callable, Collection, Iterable, NamedTuple

from hacfed.messages import RoundPlan, StepReport, Submission
from hacfed.server.coordinator.errors import STRIKE_CODES, ErrorCode, safe_text
from hacfed.server.coordinator.reward_verification import start_verified_rewards
from hacfed.tasks.base import Task
from hacfed.tasks.verify_budget import VerifyBudgetSpent
from hacfed.trajectory import FINISH_REASONS, LOGP_EPS, ChatMessage, Trajectory
from hacfed.wire.framing import encode_submission
from hacfed.wire.types import MAX_REPORT_METRICS, WireError  # one cap: the wire refuses more before building them

MAX_ID_CHARS = 128
MAX_POLICY_VERSION = 2**62  # stays a SQLite INTEGER
REWARD_TOLERANCE = 1e-6


class Rejection(NamedTuple):
    """Why one trajectory (or, with trajectory_id None, a whole submission, its report or a missing
    group) was refused: a `(trajectory_id, code, detail)` tuple. retry_after_s: for a refusal
    that will pass later (a rate limit or a round quota), when to try again."""

    trajectory_id: str | None
    code: ErrorCode
    detail: str
    retry_after_s: float | None = None


class AcceptedTrajectory(NamedTuple):
    """A trajectory that passed every check. `trajectory.reward` is the verified reward.
    prompt_pos: the prompt's position in the plan; idx: the sample's position in its group.
    (A NamedTuple: one is built per accepted sample, and a frozen dataclass costs ~4x more to build.)"""

    trajectory: Trajectory
    claimed_reward: float
    prompt_pos: int
    idx: int


@dataclass(frozen=True)
class ValidationLimits:
    group_size: int
    max_new_tokens: int  # a response cannot have more own tokens than the plan allowed
    max_response_chars: int
    min_mean_logp: float
    min_policy_version: int = 0  # a participant's policy never goes back in time
    verify_threads: int = 1  # threads re-verifying rewards (module docstring); the verdicts never depend on it
    verify_budget_s: float | None = None  # the most seconds its verification may take (None: unbounded)


@dataclass(frozen=True)
class ValidationOutcome:
    accepted: tuple[AcceptedTrajectory, ...]
    rejections: tuple[Rejection, ...]
    report_rejection: Rejection | None = None

    @property
    def strikes(self) -> tuple[Rejection, ...]:
        return tuple(r for r in self.rejections if r.code in STRIKE_CODES)


def submission_digest(sub: Submission, encoded: bytes | None = None) -> tuple[int, str]:
    """(size in bytes, sha256 hex) of the submission's wire encoding: the canonical `WireMessage`
    that `hacfed.wire.encode_submission` writes, the bytes a lab signs.

    The digest identifies a submission for idempotent resends: the same domain content always
    gives the same digest, whatever transport carried it (local-only token ids are not on the
    wire). `encoded`: the bytes `sub` was decoded from, when a transport has them; the decoder
    accepts only the canonical encoding, so they are exactly `encode_submission(sub)` and are
    hashed as they are (0.5 ms for a 1,000-sample submission, where encoding it again takes ~3 ms:
    bench/coordinator_scale.py). A lab can check a receipt's `content_hash` against the sha256 of
    what it sent.

    An object the wire cannot encode (wrong types behind the dataclasses' backs: nothing a decoder
    builds, only an in-process caller's) raises `ValueError` naming why; the intake refuses it."""
    if encoded is None:
        try:
            encoded = encode_submission(sub)
        except (WireError, TypeError, ValueError, AttributeError, KeyError, OverflowError) as exc:
            detail = exc.message if isinstance(exc, WireError) else f"{type(exc).__name__}: {exc}"
            raise ValueError(f"the submission cannot be encoded for the wire: {safe_text(detail, 300)}") from None
    return len(encoded), hashlib.sha256(encoded).hexdigest()


def quick_size_rejection(sub: Submission, max_trajectories: int, max_bytes: int) -> Rejection | None:
    """O(number of trajectories) bound checked before encoding anything (T8): too many samples, or
    more characters of text than the byte cap allows (a character is at least one byte)."""
    count = len(sub.trajectories)
    if count > max_trajectories:
        return Rejection(None, ErrorCode.SIZE, f"{count} trajectories > {max_trajectories} (prompts x G)")
    chars = 0
    for t in sub.trajectories:
        if isinstance(t, Trajectory) and isinstance(t.response_text, str):
            chars += len(t.response_text) + sum(len(m.content) for m in t.prompt if isinstance(m, ChatMessage))
    if chars > max_bytes:
        return Rejection(None, ErrorCode.SIZE, f"{chars} characters of text > max_submission_bytes {max_bytes}")
    return None


def check_report(report: object, participant_id: str, round_id: int) -> Rejection | None:
    """A StepReport describes the policy that rolled out this round: trained on pool round_id-1
    (or, for a baseline, nothing yet), so its round is round_id - 1 or round_id."""
    if report is None:
        return None
    if not isinstance(report, StepReport):
        return Rejection(None, ErrorCode.SCHEMA, f"report is a {type(report).__name__}, not a StepReport")
    if report.participant_id != participant_id:
        detail = f"report.participant_id {safe_text(report.participant_id)} != {participant_id}"
        return Rejection(None, ErrorCode.SOURCE_MISMATCH, detail)
    if report.round_id not in (round_id - 1, round_id):
        detail = f"report.round_id {safe_text(report.round_id)} not in ({round_id - 1}, {round_id})"
        return Rejection(None, ErrorCode.SCHEMA, detail)
    if len(report.metrics) > MAX_REPORT_METRICS:
        return Rejection(None, ErrorCode.SIZE, f"report has {len(report.metrics)} metrics > {MAX_REPORT_METRICS}")
    for key, value in report.metrics.items():
        if not is_short_id(key):
            return Rejection(None, ErrorCode.SCHEMA, f"report metric name {safe_text(key)} is not a short text")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return Rejection(None, ErrorCode.SCHEMA,
                             f"report metric {key} must be a finite number, got {safe_text(value)}")
    return None


def validate_submission(
    sub: Submission,
    plan: RoundPlan,
    task: Task,
    limits: ValidationLimits,
    used_trajectory_ids: Collection[str] = frozenset(),
) -> ValidationOutcome:
    """Judge every trajectory of `sub` (already past the submission gates: run, round, identity).

    used_trajectory_ids: ids of this submission that its participant already used (ids are namespaced
      by their source: another participant's ids never collide with them).
    """
    return start_validation(sub, plan, task, limits, used_trajectory_ids)()


def start_validation(
    sub: Submission,
    plan: RoundPlan,
    task: Task,
    limits: ValidationLimits,
    used_trajectory_ids: Collection[str] = frozenset(),
) -> Callable[[], ValidationOutcome]:
    """`validate_submission` in two halves: the cheap checks run and the reward verification starts
    now; the function returned waits for the verdicts and gives the outcome. With a task that has
    `start_verify_batch` the verifier's workers decide meanwhile (`reward_verification.start_verified_rewards`)."""
    planned = {p.prompt_id: (pos, p.messages) for pos, p in enumerate(plan.prompts)}
    rejections: list[Rejection] = []
    groups: dict[str, list[tuple[Trajectory, Rejection | None]]] = {}
    seen: set[str] = set()
    short_ids: set[str] = set()  # prompt and source ids (plain str) already found short: each repeats G times or more
    for t in sub.trajectories:
        problem = _cheap_check(t, sub.participant_id, planned, task, limits, seen, used_trajectory_ids, short_ids)
        if isinstance(t, Trajectory) and isinstance(t.trajectory_id, str):
            seen.add(t.trajectory_id)
        if isinstance(t, Trajectory) and isinstance(t.prompt_id, str) and t.prompt_id in planned:
            groups.setdefault(t.prompt_id, []).append((t, problem))
        elif problem is not None:
            rejections.append(problem)
    judged: list[tuple[str, int, list[tuple[Trajectory, Rejection | None]] | None, list[Rejection]]] = []
    to_verify: list[tuple[Any, Trajectory]] = []  # (problem, sample) of every group that passed, in plan order
    for prompt_id, (pos, _) in planned.items():
        samples = groups.get(prompt_id, [])
        if not samples:
            detail = f"prompt {prompt_id}: 0 of {limits.group_size} samples"
            judged.append((prompt_id, pos, None, [Rejection(None, ErrorCode.INCOMPLETE_GROUP, detail)]))
            continue
        group_rejections = _cheap_group_rejections(prompt_id, samples, limits.group_size)
        if group_rejections:
            judged.append((prompt_id, pos, None, group_rejections))
            continue
        # Every cheap check passed: now (and only now) the verifier is spent on the group.
        problem = task.problem(prompt_id)
        to_verify.extend((problem, t) for t, _ in samples)
        judged.append((prompt_id, pos, samples, []))
    rewards = start_verified_rewards(task, to_verify, limits.verify_threads, limits.verify_budget_s)
    claims = plan.answer_keys == "public"  # else the labs hold no answers and claim nothing
    report_rejection = check_report(sub.report, sub.participant_id, sub.round_id)

    def outcome() -> ValidationOutcome:
        try:
            verified = iter(rewards())
        except VerifyBudgetSpent as exc:  # the whole submission is refused, a strike
            spent = Rejection(None, ErrorCode.VERIFY_BUDGET, safe_text(str(exc)))
            return ValidationOutcome((), tuple(rejections) + (spent,), report_rejection)
        accepted: list[AcceptedTrajectory] = []
        refused = list(rejections)
        for prompt_id, pos, samples, group_rejections in judged:
            if samples is None:
                refused.extend(group_rejections)
                continue
            verdicts = [next(verified) for _ in samples]
            group_accepted, group_rejections = _judge_rewards(prompt_id, pos, samples, verdicts, claims)
            accepted.extend(group_accepted)
            refused.extend(group_rejections)
        return ValidationOutcome(tuple(accepted), tuple(refused), report_rejection)

    return outcome


def _cheap_group_rejections(
    prompt_id: str, samples: list[tuple[Trajectory, Rejection | None]], group_size: int
) -> list[Rejection]:
    """The rejections of a group that is not exactly G samples that all passed the cheap checks
    (every sample gets one: its own, or INCOMPLETE_GROUP / GROUP_REJECTED); [] for a group to verify."""
    failed = [r for _, r in samples if r is not None]
    if len(samples) != group_size:
        detail = f"prompt {prompt_id}: {len(samples)} samples, expected exactly {group_size}"
        return [r or Rejection(t.trajectory_id, ErrorCode.INCOMPLETE_GROUP, detail) for t, r in samples]
    if failed:
        detail = f"prompt {prompt_id}: sibling {safe_text(failed[0].trajectory_id)} rejected ({failed[0].code})"
        return [r or Rejection(t.trajectory_id, ErrorCode.GROUP_REJECTED, detail) for t, r in samples]
    return []


def _judge_rewards(prompt_id: str, pos: int, samples: list[tuple[Trajectory, Rejection | None]],
                   verified: list[float], claims: bool = True) -> tuple[list[AcceptedTrajectory], list[Rejection]]:
    """A verified group: accepted with its verified rewards, or, when labs claim rewards (`claims`) and
    one differs from its verdict, REWARD_MISMATCH for those samples and GROUP_REJECTED for their siblings."""
    mismatched = {
        t.trajectory_id: v for (t, _), v in zip(samples, verified) if abs(float(t.reward) - v) > REWARD_TOLERANCE
    } if claims else {}
    if mismatched:
        first = next(iter(mismatched))
        rejected = []
        for t, _ in samples:
            if t.trajectory_id in mismatched:
                detail = f"claimed reward {t.reward!r}, verifier says {mismatched[t.trajectory_id]!r}"
                rejected.append(Rejection(t.trajectory_id, ErrorCode.REWARD_MISMATCH, detail))
            else:
                detail = f"prompt {prompt_id}: sibling {first} rejected ({ErrorCode.REWARD_MISMATCH})"
                rejected.append(Rejection(t.trajectory_id, ErrorCode.GROUP_REJECTED, detail))
        return [], rejected
    accepted = [
        AcceptedTrajectory(_with_reward(t.without_local_ids(), v), float(t.reward), pos, idx)
        for idx, ((t, _), v) in enumerate(zip(samples, verified))
    ]
    return accepted, []


def _with_reward(t: Trajectory, reward: float) -> Trajectory:
    """`t` carrying the verified `reward`. When its claim already is exactly that float (the usual
    case for an accepted sample: honest labs claim the 0.0 or 1.0 their own verifier gave), `t`
    itself: `dataclasses.replace` would build an equal copy and re-run every check of
    `Trajectory.__post_init__`, a tenth of a sample's judging time (bench/coordinator_scale.py)."""
    if type(t.reward) is float and t.reward == reward and math.copysign(1.0, t.reward) == math.copysign(1.0, reward):
        return t
    return dataclasses.replace(t, reward=reward)


def _cheap_check(
    t: object,
    participant_id: str,
    planned: dict[str, tuple[int, tuple[ChatMessage, ...]]],
    task: Task,
    limits: ValidationLimits,
    seen: set[str],
    used: Collection[str],
    short_ids: set[str] | None = None,
) -> Rejection | None:
    """The first failed check of one trajectory, cheapest first; None if it passes them all.
    `short_ids`: ids of this submission already found to be short ids (`is_short_id`), added to."""
    if short_ids is None:
        short_ids = set()
    if not isinstance(t, Trajectory):
        return Rejection(None, ErrorCode.SCHEMA, f"a {type(t).__name__} is not a Trajectory")
    tid = t.trajectory_id
    for name in ("trajectory_id", "prompt_id", "source_id"):
        value = getattr(t, name)
        if type(value) is str and value in short_ids:  # exact str: equality and hashing are str's own
            continue
        if not is_short_id(value):
            detail = f"{name} {safe_text(value)} is not 1-{MAX_ID_CHARS} printable chars"
            return Rejection(_id_or_none(tid), ErrorCode.SCHEMA, detail)
        if name != "trajectory_id" and type(value) is str:
            short_ids.add(value)
    if not isinstance(t.response_text, str):
        return Rejection(tid, ErrorCode.SCHEMA, "response_text is not text")
    if len(t.response_text) > limits.max_response_chars:
        detail = f"response of {len(t.response_text)} chars > max_response_chars {limits.max_response_chars}"
        return Rejection(tid, ErrorCode.SIZE, detail)
    if not is_storable_text(t.response_text):
        return Rejection(tid, ErrorCode.SCHEMA, "response_text is not valid Unicode (lone surrogate)")
    if tid in seen or tid in used:
        return Rejection(tid, ErrorCode.DUPLICATE, f"trajectory id {tid} already used")
    if t.source_id != participant_id:
        return Rejection(tid, ErrorCode.SOURCE_MISMATCH,
                         f"source_id {t.source_id} != submitting participant {participant_id}")
    if t.prompt_id not in planned:
        try:
            task.problem(t.prompt_id)
        except KeyError:
            return Rejection(tid, ErrorCode.UNKNOWN_PROMPT, f"prompt {t.prompt_id} is not a prompt of task {task.name}")
        return Rejection(tid, ErrorCode.UNASSIGNED_PROMPT, f"prompt {t.prompt_id} is not in this round's plan")
    if tuple(t.prompt) != planned[t.prompt_id][1]:
        return Rejection(tid, ErrorCode.PROMPT_MISMATCH, f"prompt messages of {t.prompt_id} differ from the plan")
    return _check_numbers(t, limits)


def _check_numbers(t: Trajectory, limits: ValidationLimits) -> Rejection | None:
    tid = t.trajectory_id
    reward = t.reward
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward) \
            or not 0 <= reward <= 1:
        return Rejection(tid, ErrorCode.SCHEMA, f"claimed reward {safe_text(reward)} is not a number in [0, 1]")
    if t.finish_reason not in FINISH_REASONS:
        return Rejection(tid, ErrorCode.SCHEMA, f"finish_reason {safe_text(t.finish_reason)} not in {FINISH_REASONS}")
    n, lp = t.source_token_count, t.source_logp_sum
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        return Rejection(tid, ErrorCode.SCHEMA, f"source_token_count {safe_text(n)} is not an int >= 0")
    if isinstance(lp, bool) or not isinstance(lp, (int, float)) or not math.isfinite(lp):
        return Rejection(tid, ErrorCode.LOGPROB_RANGE, f"source_logp_sum {safe_text(lp)} is not finite")
    if lp > LOGP_EPS:
        return Rejection(tid, ErrorCode.LOGPROB_RANGE, f"source_logp_sum {lp!r} > 0")
    if n > limits.max_new_tokens:
        detail = f"source_token_count {n} > plan's max_new_tokens {limits.max_new_tokens}"
        return Rejection(tid, ErrorCode.LOGPROB_RANGE, detail)
    if n == 0 and lp != 0:
        return Rejection(tid, ErrorCode.LOGPROB_RANGE, f"0 tokens with source_logp_sum {lp!r}")
    if n > 0 and lp / n < limits.min_mean_logp:
        return Rejection(tid, ErrorCode.LOGPROB_RANGE,
                         f"mean log-prob {lp / n:.3f} < min_mean_logp {limits.min_mean_logp}")
    if not t.response_text and t.finish_reason != "stop":
        # Nothing a learner can train on. An empty text that stopped (EOS only, or special tokens
        # that decode to nothing) is fine: every learner sees it as its own EOS.
        detail = f"empty response_text with finish_reason {t.finish_reason!r} and {n} tokens"
        return Rejection(tid, ErrorCode.SCHEMA, detail)
    v = t.policy_version
    if isinstance(v, bool) or not isinstance(v, int) or not limits.min_policy_version <= v < MAX_POLICY_VERSION:
        return Rejection(
            tid, ErrorCode.POLICY_VERSION,
            f"policy_version {safe_text(v)} outside [{limits.min_policy_version}, 2**62) (versions never decrease)",
        )
    return None


def is_storable_text(text: str) -> bool:
    """UTF-8 encodable (no lone surrogates), so it can be hashed, journaled and re-sent."""
    if type(text) is str and text.isascii():  # O(1) in CPython (a flag of the str); ASCII always encodes
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def is_short_id(value: object) -> bool:
    """An id or name a peer chose: 1-128 printable characters (no newlines or bidi controls that
    would forge log lines), storable as UTF-8."""
    return isinstance(value, str) and 0 < len(value) <= MAX_ID_CHARS and value.isprintable() and is_storable_text(value)


def _id_or_none(value: object) -> str | None:
    return value if is_short_id(value) else None


def report_to_dict(report: StepReport) -> dict[str, Any]:
    """JSON-able form of a StepReport that passed `check_report`, for the metrics table."""
    metrics = {k if isinstance(k, str) else repr(k): v for k, v in report.metrics.items()}
    return {"participant_id": report.participant_id, "round_id": report.round_id, "metrics": metrics,
            "eval_accuracy": report.eval_accuracy}


def rejections_by_code(rejections: Iterable[Rejection]) -> dict[str, int]:
    """Counts per code, for metrics and logs."""
    out: dict[str, int] = {}
    for r in rejections:
        out[r.code.value] = out.get(r.code.value, 0) + 1
    return out
