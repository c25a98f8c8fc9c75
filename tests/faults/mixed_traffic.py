"""Mixed good and bad traffic from several clients against the coordinator's round driver (security.md R8).

`run_mixed_soak` is the soak of `test_soak.py::test_mixed_good_and_bad_traffic_keeps_codes_receipts_and_memory`:

- a `FederationDriver` in this process over its real `Coordinator`, SQLite journal (WAL,
  `synchronous=FULL`), audit log and reward verifier, on a clock that runs with real time (token
  buckets refill as they would) plus a jump that closes a round by deadline when quorum does not;
- `clients` threads, each holding some good labs and some hostile labs, answer what the driver
  sends their labs (like a SuperNode, a lab replies only to a delivery; a refused lab is asked
  again at once) at `rate / clients` replies per second each, into one bounded queue (a full queue
  blocks the client, as a transport does); the test's thread is the ServerApp's round loop, handing
  each reply to `FederationDriver.on_replies` in arrival order and the next deliveries to the clients;
- good traffic: each good lab's honest submission for the open round, once per round, one time in
  five with its previous submission riding along as an identical resend (an outbox whose receipt
  was lost), and an empty reply to a delivery of answers only; bad traffic: the hostile corpus's cases that are
  refused before the journal records a submission (tests/faults/hostile_cases.py; the cases of
  megabytes are left out: they cost the driver 0.1-0.7 s each and measure parsing, not a soak), each
  built afresh for the open round, one at random per request;
- a round closes as soon as every good lab's submission for it is accepted (by its deadline: the
  clock jumps past it, since the hostile labs never make a quorum), and the next opens.

Every answer is opened and checked as it comes: a good submission must get one receipt accepting
exactly its samples, a resend the original receipt; a bad case only codes its case allows, plus the
refusals any lab may get for its traffic (rate limit, round quotas) and, for a request built for a
round that has since closed, the late-round codes. Nothing is kept per request (counts only), so
what the process holds is the coordinator's own state; its RSS is sampled on a thread.
"""

from __future__ import annotations

import queue
import random
import secrets
import statistics
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from hacfed.envelope import generate_key, key_id, save_public_key
from hacfed.exchange import seal_lab_reply
from hacfed.keys import ensure_key_pair
from hacfed.messages import RoundPlan
from hacfed.server.config import ServerConfig, ServerSettings
from hacfed.server.driver import FederationDriver
from hacfed.wire import SubmissionReceipt, SubmissionRefusal
from tests.faults.hostile_cases import CORPUS
from tests.faults.hostile_lab import Case, Ctx, DriverHarness, E, Lab
from tests.unit.test_coordinator_fakes import make_config, scripted_submission

# Cases of megabytes (refused by size or depth after up to 0.7 s of parsing each): not soaked; nor
# "future-round", whose round 7 is a past round once the soak has passed it.
BIG = frozenset({"1e5-trajectories", "1e5-prompt-messages", "1e5-report-metrics", "1e5-resends",
                 "nested-1e5-deep-submission", "nested-1e5-deep-reply", "reply-over-16-mib"})
MAX_BAD_BYTES = 64 * 1024
# Refusals any lab's traffic may meet besides its case's own codes: its token bucket or its round's quotas.
TRAFFIC_CODES = frozenset({E.RATE_LIMITED.value, E.QUOTA_BYTES.value, E.QUOTA_TRAJECTORIES.value})
# A request built for a round that closed before the driver took it.
LATE_CODES = frozenset({E.STALE_ROUND.value, E.ROUND_CLOSED.value, E.UNKNOWN_ROUND.value})


def soak_cases() -> list[Case]:
    """The corpus's cases a lab can send again and again: refused before the journal records a
    submission, no honest first exchange, not megabytes."""
    return [c for c in CORPUS if c.early and c.setup is None and c.name not in BIG | {"future-round"}]


class RunningClock:
    """Real monotonic time plus `jumped`, which the round loop raises to pass a round's deadline."""

    def __init__(self) -> None:
        self.jumped = 1_000_000.0

    def __call__(self) -> float:
        return time.monotonic() + self.jumped

    def sleep(self, seconds: float) -> None:
        self.jumped += seconds


class SoakHarness(DriverHarness):
    """DriverHarness with a running clock, rounds without end, and per-lab limits raised for rounds
    that last a second here, not minutes: the good labs' submissions stay within the rate limit,
    and most hostile requests get past the round quotas to the decoders and checks behind them
    (the flood case still meets the rate limit)."""

    def __init__(self, tmp_path: Path, labs: list[str], good: int) -> None:  # noqa: PLR0913 - no super().__init__
        state = tmp_path / "server"
        self.clock = RunningClock()  # type: ignore[assignment]
        coordinator = ensure_key_pair(state, "coordinator")
        self.coordinator_public = coordinator.load().public_key()
        self.trusted = {key_id(self.coordinator_public): self.coordinator_public}
        keys_dir = state / "keys"
        keys_dir.mkdir(parents=True, exist_ok=True)
        self.cfg = make_config(state, rounds=1_000_000, prompts_per_round=2, group_size=2, expected_participants=good,
                               min_participants=1, round_deadline_s=3600.0, eval_every=0,
                               rate_limit_per_s=20.0, rate_limit_burst=32,
                               round_quota_trajectories=100_000, round_quota_bytes=2**30)
        settings = ServerConfig(self.cfg, ServerSettings(insecure=True, retry_interval_s=0.01), state)
        self.labs = {pid: Lab(pid, generate_key()) for pid in labs}
        for lab in self.labs.values():
            save_public_key(lab.key.public_key(), keys_dir / f"{lab.pid}.pub")
        self.nodes = {100 + i: pid for i, pid in enumerate(labs)}
        self.lines: list[str] = []
        self.driver = FederationDriver(settings, clock=self.clock, monotonic=self.clock, console=self.lines.append)
        self.mapped: dict[int, str] = {}
        self.answered: list[tuple[str, bytes]] = []
        for name in ("receipt", "refusal"):
            self._record(name)


@dataclass(frozen=True)
class Request:
    kind: str  # "good", "resend" or "bad"
    pid: str
    round_id: int  # the round whose plan it was built for
    reply: bytes
    case: Case | None = None
    expected: int = 0  # good: samples the receipt must accept; resend: the original receipt's count


@dataclass
class Tally:
    sent: Counter = field(default_factory=Counter)  # kind -> requests the driver took
    codes: Counter = field(default_factory=Counter)  # code -> answers carrying it (bad traffic)
    unexpected: list[str] = field(default_factory=list)
    good_accepted: int = 0  # samples of good submissions accepted (each once)
    rounds: int = 0


@dataclass
class SoakResult:
    seconds: float
    tally: Tally
    rss_times: list[float]
    rss_mib: list[float]
    warmup_s: float

    @property
    def requests(self) -> int:
        return sum(self.tally.sent.values())

    @property
    def rate(self) -> float:
        return self.requests / self.seconds

    @property
    def slope_mib_min(self) -> float:
        """Least-squares slope of RSS over time after the warm-up, in MiB per minute."""
        pairs = [(t, r) for t, r in zip(self.rss_times, self.rss_mib, strict=True) if t >= self.warmup_s]
        return statistics.linear_regression([t for t, _ in pairs], [r for _, r in pairs]).slope * 60.0

    def summary(self) -> str:
        after = [r for t, r in zip(self.rss_times, self.rss_mib, strict=True) if t >= self.warmup_s]
        top = ", ".join(f"{c.removeprefix('HACFED-E-')} {n}" for c, n in self.tally.codes.most_common())
        return (f"mixed soak {self.seconds:.0f}s: {self.requests} requests, {self.rate:.1f}/s "
                f"({dict(self.tally.sent)}), {self.tally.rounds} rounds, {self.tally.good_accepted} good samples "
                f"accepted once each; RSS after {self.warmup_s:.0f}s warm-up {after[0]:.1f} -> {after[-1]:.1f} MiB "
                f"(max {max(self.rss_mib):.1f}), slope {self.slope_mib_min:+.3f} MiB/min over {len(after)} samples; "
                f"bad-traffic codes: {top}")


class Clients:
    """`n` client threads, each with its good and hostile labs. Like a SuperNode, a lab replies only
    to what it was sent: the round loop hands each delivery's lab to its client (`ask`), and the
    client answers it at its pace (`rate / n` replies per second)."""

    def __init__(self, harness: SoakHarness, good: list[str], bad: list[str], n: int, rate: float,
                 resend_share: float, seed: int) -> None:
        self.harness, self.rate, self.n, self.resend_share = harness, rate, n, resend_share
        self.cases = soak_cases()
        self.good = frozenset(good)
        self.helpers = good  # whose id and key a hostile case may name as "another lab"
        self.owner = {pid: i % n for i, pid in enumerate(good)} | {pid: i % n for i, pid in enumerate(bad)}
        self.inbox: list[queue.Queue[str]] = [queue.Queue() for _ in range(n)]
        self.out: queue.Queue[Request] = queue.Queue(maxsize=4 * n)
        self.stop = threading.Event()
        self.plan: tuple[int, RoundPlan] | None = None  # the open round, set by the round loop
        self.stranger = generate_key()
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._run, args=(random.Random(seed + i), i),
                                         name=f"soak-client-{i}", daemon=True) for i in range(n)]

    def ask(self, pid: str) -> None:
        self.inbox[self.owner[pid]].put(pid)

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def close(self) -> None:
        self.stop.set()
        while True:  # unblock producers waiting on a full queue
            try:
                self.out.get_nowait()
            except queue.Empty:
                break
        for t in self.threads:
            t.join(timeout=30)
        assert not any(t.is_alive() for t in self.threads)

    def _run(self, rng: random.Random, index: int) -> None:
        try:
            self._produce(rng, self.inbox[index])
        except BaseException as exc:  # noqa: BLE001 - reported by the round loop
            self.errors.append(exc)

    def _produce(self, rng: random.Random, inbox: queue.Queue[str]) -> None:
        period, due = self.n / self.rate, time.monotonic()
        sent_round: dict[str, int] = {}
        last_item: dict[str, bytes] = {}
        while not self.stop.is_set():
            try:
                pid = inbox.get(timeout=0.2)
            except queue.Empty:
                continue
            due += period
            if (wait := due - time.monotonic()) > 0:
                time.sleep(wait)
            elif wait < -1.0:
                due = time.monotonic()  # behind by more than a second: the rate is not kept, don't burst
            assert self.plan is not None
            round_id, plan = self.plan
            lab = self.harness.labs[pid]
            if pid in self.good:
                request = self._good(pid, lab, round_id, plan, sent_round, last_item, rng)
            else:
                case = rng.choice(self.cases)
                ctx = Ctx(lab, plan, self.harness.labs[rng.choice(self.helpers)], self.stranger)
                attack = case.build(ctx)
                reply = attack.outer if attack.outer is not None else ctx.reply(attack.items)
                assert len(reply) <= MAX_BAD_BYTES, (case.name, len(reply))
                request = Request("bad", pid, round_id, reply, case)
            while not self.stop.is_set():
                try:
                    self.out.put(request, timeout=0.2)
                    break
                except queue.Full:
                    continue

    def _good(self, pid: str, lab: Lab, round_id: int, plan: RoundPlan, sent_round: dict[str, int],
              last_item: dict[str, bytes], rng: random.Random) -> Request:
        """The lab's honest submission for the open round, with its previous one as an identical
        resend now and then (an outbox whose receipt was lost); asked again after it submitted (a
        delivery of answers only), an empty reply."""
        if sent_round.get(pid, -1) >= round_id:
            return Request("empty", pid, round_id, seal_lab_reply(b"", (), lab.key))
        sub = scripted_submission(plan, pid, nonce=secrets.token_hex(16), created_at_ms=int(time.time() * 1e3))
        item = Ctx(lab, plan, lab, self.stranger).sealed(sub)
        resends = (last_item[pid],) if pid in last_item and rng.random() < self.resend_share else ()
        sent_round[pid], last_item[pid] = round_id, item
        kind = "good+resend" if resends else "good"
        return Request(kind, pid, round_id, seal_lab_reply(item, resends, lab.key), expected=len(sub.trajectories))


def _rss_sampler(stop: threading.Event, every_s: float, started: float, times: list[float], rss: list[float]) -> None:
    me = psutil.Process()
    while not stop.wait(every_s):
        times.append(time.monotonic() - started)
        rss.append(me.memory_info().rss / 2**20)


def run_mixed_soak(tmp_path: Path, *, seconds: float, rate: float = 50.0, clients: int = 4, good_per_client: int = 2,
                   bad_per_client: int = 4, sample_s: float = 0.5, warmup_s: float = 10.0,
                   seed: int = 31) -> tuple[SoakResult, SoakHarness]:
    good = [f"good-{i:02d}" for i in range(clients * good_per_client)]
    bad = [f"bad-{i:02d}" for i in range(clients * bad_per_client)]
    harness = SoakHarness(tmp_path, good + bad, len(good))
    harness.hello_all({})
    load = Clients(harness, good, bad, clients, rate, resend_share=0.2, seed=seed)
    tally = Tally()
    coordinator = harness.driver.coordinator
    first = harness.exchange()
    assert coordinator.current_round == 0, harness.lines[-5:]
    load.plan = (0, coordinator.plan_for(0))
    for node in first:
        load.ask(harness.nodes[node])
    submitted: set[str] = set()
    times: list[float] = []
    rss: list[float] = []
    stop = threading.Event()
    started = time.monotonic()
    sampler = threading.Thread(target=_rss_sampler, args=(stop, sample_s, started, times, rss), daemon=True)
    sampler.start()
    load.start()
    try:
        while time.monotonic() - started < seconds:
            assert not load.errors, load.errors
            try:
                request = load.out.get(timeout=1.0)
            except queue.Empty:
                request = None
            if request is not None:
                round_id = coordinator.current_round
                _, answers = harness.send(request.pid, request.reply)
                del harness.answered[:]  # nothing kept per request
                tally.sent[request.kind] += 1
                if _check(request, answers, round_id, tally) and request.round_id == round_id:
                    submitted.add(request.pid)
            lines, harness.lines[:] = list(harness.lines), []
            unprintable = [line for line in lines if not all(ch.isprintable() for ch in line)]
            assert not unprintable, unprintable[:3]
            round_id = coordinator.current_round
            if submitted >= load.good:  # every good lab is in: close by deadline (the hostile labs never
                harness.clock.sleep(2 * harness.cfg.round_deadline_s)  # make a quorum), open the next
                submitted.clear()
            asks = harness.exchange()
            if coordinator.current_round != round_id:
                assert coordinator.current_round is not None and coordinator.current_round > round_id
                tally.rounds += 1
                load.plan = (coordinator.current_round, coordinator.plan_for(coordinator.current_round))
            for node in asks:
                load.ask(harness.nodes[node])
    finally:
        elapsed = time.monotonic() - started
        stop.set()
        load.close()
        sampler.join(timeout=10)
    return SoakResult(elapsed, tally, times, rss, warmup_s), harness


def _check(request: Request, answers: list, current: int | None, tally: Tally) -> bool:
    """Each answer against what its request may get, counted; whether a good submission was accepted."""
    name = request.case.name if request.case else f"{request.kind} {request.pid} round {request.round_id}"
    if request.kind == "empty":
        if any(isinstance(a, SubmissionRefusal) for a in answers):
            tally.unexpected.append(f"{name}: {answers!r:.300}")
        return False
    if request.kind in ("good", "good+resend"):
        items = 2 if request.kind == "good+resend" else 1
        ok = (len(answers) == items and all(isinstance(a, SubmissionReceipt) and not a.rejections
                                            and len(a.accepted_trajectory_ids) == request.expected for a in answers))
        if ok:
            tally.good_accepted += request.expected
        else:
            tally.unexpected.append(f"{name}: {answers!r:.300}")
        return ok
    allowed = request.case.allowed() | TRAFFIC_CODES | (LATE_CODES if request.round_id != current else frozenset())
    if not answers:
        tally.unexpected.append(f"{name}: no answer")
    for answer in answers:
        if isinstance(answer, SubmissionRefusal):
            codes = {answer.code}
        else:
            codes = {r.code for r in answer.rejections} or {"receipt"}
            if answer.accepted_trajectory_ids:
                codes.add("accepted")
        for code in codes:
            tally.codes[code] += 1
            if code not in allowed:
                tally.unexpected.append(f"{name}: {code} (allowed {sorted(allowed)})")
    return False
