"""MathVerifier: answer extraction, in-process refusals, and the sandboxed math-verify worker on hostile input."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Iterator

import pytest

from hacfed.tasks import sandbox
from hacfed.tasks.math_answers import (
    extract_answer,
    extract_boxed,
    extract_last_number,
    nesting_depth,
    parse_plain_number,
)
from hacfed.tasks.math_verifier import MathVerifier, MathVerifierConfig
from hacfed.tasks.sandbox import (
    VERIFIER_ABORT,
    SandboxedWorker,
    SandboxIsolationError,
    SandboxLimits,
    SandboxStartError,
    network_isolation_prefix,
)
from tests.unit.test_server_config import BASE

ABORT = f"{VERIFIER_ABORT}: "
MATH_FACTORY = "hacfed.tasks.math_worker:worker_handler"


@pytest.fixture(scope="module")
def verifier() -> Iterator[MathVerifier]:
    with MathVerifier() as v:
        yield v


# ----------------------------------------------------------------------------- extraction (pure)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{72}.", "72"),
        ("\\boxed{1} and finally \\boxed{2}", "2"),
        ("\\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{1}{\\sqrt{2}}"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),  # escaped braces are not grouping
        ("\\boxed 5 apples", "5"),
        ("\\boxed{2} then \\boxed{3", None),  # the final box is truncated: no answer, not the earlier one
        ("\\boxedtext{4}", None),
        ("no box at all", None),
        ("\\boxed{}", ""),
        ("\\boxed{" + "{" * 10_000 + "}" * 10_000 + "}", "{" * 10_000 + "}" * 10_000),  # iterative, no recursion
    ],
)
def test_extract_boxed(text: str, expected: str | None) -> None:
    assert extract_boxed(text) == expected


def test_nesting_depth_counts_all_bracket_kinds() -> None:
    assert nesting_depth("\\left(\\frac{1}{[2]}\\right)") == 3
    assert nesting_depth("1)) + (2") == 1  # stray closers do not go negative
    assert nesting_depth("") == 0


def test_extract_last_number_and_modes() -> None:
    assert extract_last_number("first 3, then 1,080.5 and -7 dollars") == "-7"
    assert extract_last_number("x2 and y3") is None  # digits inside words are not answers
    assert extract_last_number("total: 1,234") == "1,234"
    assert extract_answer("42 but \\boxed{7}", "boxed_or_last_number") == "7"
    assert extract_answer("answer 42", "boxed_or_last_number") == "42"
    assert extract_answer("answer 42", "boxed") is None
    assert extract_answer("\\boxed{7} then 42", "last_number") == "42"


@pytest.mark.parametrize(
    ("text", "value"),
    [("72", Decimal(72)), (" -1,080.50 ", Decimal("-1080.5")), ("+.5", Decimal("0.5")),
     ("1,08", None), ("1/2", None), ("\\$72", None), ("1e9", None), ("", None)],
)
def test_parse_plain_number(text: str, value: Decimal | None) -> None:
    assert parse_plain_number(text) == value


# ----------------------------------------------------------------------------- in-process refusals


@pytest.mark.parametrize(
    ("response", "reason"),
    [
        ("x" * 1_000_000 + "\\boxed{72}", ABORT + "refused: response of 1000010 chars exceeds 10000"),
        ("\\boxed{72}\x00", ABORT + "refused: response contains a NUL character"),
        ("\\boxed{72}\ud800", ABORT + "refused: response is not valid Unicode (lone surrogate)"),
        (b"\\boxed{72}", ABORT + "refused: response is a bytes, not text"),
        (None, ABORT + "refused: response is a NoneType, not text"),
        ("\\boxed{" + "1+" * 150 + "1}", ABORT + "refused: answer of 301 chars exceeds 200"),
        ("\\boxed{" + "{" * 9 + "1" + "}" * 9 + "}", ABORT + "refused: answer nests brackets 9 deep (max 8)"),
        ("\\boxed{" + "(" * 95 + "1" + ")" * 95 + "}", ABORT + "refused: answer nests brackets 95 deep (max 8)"),
        ("\\boxed{" + "{" * 4000 + "}" * 4000 + "}", ABORT + "refused: answer of 8000 chars exceeds 200"),
        ("the answer is 72", "no \\boxed{} answer found"),
        ("\\boxed{  }", "empty answer"),
        ("\\boxed{71}", "wrong answer"),
    ],
)
def test_refusals_and_plain_numbers_never_reach_the_worker(response: object, reason: str) -> None:
    verifier = MathVerifier()  # never started: nothing below needs it
    verdict = verifier.verify("72", response)  # type: ignore[arg-type]
    assert (verdict.reward, verdict.reason) == (0.0, reason)
    assert verifier.verify("1,080", "\\boxed{1080.0}").reward == 1.0  # numeric fast path
    assert verifier.worker_calls == 0 and verifier.worker_starts == 0


def test_gold_must_be_text() -> None:
    with pytest.raises(ValueError, match="non-empty gold answer"):
        MathVerifier().verify("", "\\boxed{1}")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"answer_mode": "first"}, "answer_mode"), ({"max_answer_chars": 0}, "max_answer_chars"),
     ({"sandbox": {"timeout_s": 1}}, "sandbox must be a SandboxLimits")],
)
def test_config_validation(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MathVerifierConfig(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"timeout_s": 0}, "timeout_s"), ({"memory_bytes": 1 << 20}, "memory_bytes"), ({"network": "maybe"}, "network"),
     ({"network": "auto"}, "off-unsafe"), ({"network": "off"}, "off-unsafe"),
     ({"cpu_s_per_item": 0}, "cpu_s_per_item"), ({"timeout_s": 10, "cpu_s_lifetime": 20}, "cpu_s_lifetime")],
)
def test_sandbox_limits_validation(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SandboxLimits(**kwargs)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- through the worker


@pytest.mark.parametrize(
    ("gold", "response"),
    [("0.5", "\\boxed{\\frac{1}{2}}"), ("72", "\\boxed{72\\text{ dollars}}"), ("72", "\\boxed{72 \\text{ clips}}"),
     ("\\frac{\\sqrt{2}}{2}", "$\\boxed{\\frac{1}{\\sqrt{2}}}$"), ("x^2+2x+1", "\\boxed{(x+1)^2}")],
)
def test_equivalent_answers_score_one(verifier: MathVerifier, gold: str, response: str) -> None:
    verdict = verifier.verify(gold, response)
    assert verdict.reward == 1.0 and verdict.reason == "equivalent (math-verify)"


def test_hostile_corpus_scores_zero_and_the_verifier_survives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    # 1 s per item keeps the timeout case fast; the honest item at the end takes milliseconds. The size
    # screen is opened wide so that the tower reaches the worker (test_verify_budget: it is refused before).
    verifier = MathVerifier(MathVerifierConfig(sandbox=SandboxLimits(timeout_s=1.0), max_exponent=10**12,
                                               max_value_digits=10**12))
    hostile = {
        "import": "\\boxed{__import__('os').system('touch X')}",
        "sympify": "\\boxed{eval(\"open('X','w')\")}",
        "tower": "\\boxed{9^{9^{9}}}",  # evaluating it would need ~10^8 digits: must time out
        "latex junk": "\\boxed{\\frac{\\frac{\\frac{}{}}{}}{\\left(\\right.}}",
        "bidi": "\\boxed{\u202e72\u202c}",
    }
    verdicts = {name: verifier.verify("72", response) for name, response in hostile.items()}
    for name, verdict in verdicts.items():
        assert verdict.reward == 0.0, (name, verdict)
        assert verdict.reason, name
    assert verdicts["tower"].reason == ABORT + "timeout"
    assert list(tmp_path.iterdir()) == []  # nothing ran: no file anywhere we can see
    # (that model text is never parsed in the caller is checked in a clean subprocess: test_tasks_math)
    assert verifier.verify("0.5", "\\boxed{\\frac{2}{4}}").reward == 1.0  # still works afterwards
    verifier.close()


@pytest.mark.skipif(network_isolation_prefix() is None, reason="`unshare -n` does not work on this machine")
def test_worker_runs_without_network_where_unshare_works(verifier: MathVerifier) -> None:
    assert verifier.network_isolated


def test_no_network_isolation_is_refused_by_default_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail closed: the default limits, and every task config that holds them, refuse to exist where
    `unshare` cannot isolate the worker; the one line names the opt-out."""
    monkeypatch.setattr(sandbox, "network_isolation_prefix", lambda: None)
    for build in (SandboxLimits, MathVerifierConfig, lambda: SandboxLimits(timeout_s=2.0, network="required")):
        with pytest.raises(SandboxIsolationError) as refused:
            build()
        message = str(refused.value)
        assert isinstance(refused.value, ValueError) and isinstance(refused.value, SandboxStartError)
        assert "cannot isolate the network" in message and 'network = "off-unsafe"' in message
        assert "\n" not in message


def test_a_worker_whose_isolation_went_away_refuses_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    if network_isolation_prefix() is None:
        pytest.skip("`unshare -n` does not work on this machine")
    limits = SandboxLimits(timeout_s=2.0)
    monkeypatch.setattr(sandbox, "network_isolation_prefix", lambda: None)
    with SandboxedWorker(MATH_FACTORY, limits) as worker:
        with pytest.raises(SandboxIsolationError, match="off-unsafe"):
            worker.call({"gold": "1", "answer": "1"})
        assert worker.pid is None and worker.starts == 0


def test_the_unsafe_opt_out_runs_on_the_host_network_and_warns(monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(sandbox, "_warned_unsafe", False)
    with caplog.at_level(logging.WARNING, logger="hacfed.tasks.sandbox"):
        limits = SandboxLimits(timeout_s=5.0, network="off-unsafe")
        SandboxLimits(timeout_s=5.0, network="off-unsafe")
    assert caplog.text.count("WITHOUT network isolation") == 1  # once per process
    with SandboxedWorker(MATH_FACTORY, limits) as worker:
        assert worker.call({"gold": "1", "answer": "1"}) == {"equal": True}
        assert not worker.network_isolated


def test_the_unsafe_warning_reaches_stderr_without_any_logging_setup() -> None:
    code = "from hacfed.tasks.sandbox import SandboxLimits; SandboxLimits(network='off-unsafe')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    assert "WARNING" in done.stderr and "WITHOUT network isolation" in done.stderr


def test_hacfed_server_refuses_to_start_where_unshare_fails(tmp_path: Path) -> None:
    """A real failing `unshare` first on PATH (as where user namespaces are blocked): hacfed-server
    with a sandboxed task prints one line naming the opt-out and creates nothing."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "unshare").write_text(
        "#!/bin/sh\necho 'unshare: unshare failed: Operation not permitted' >&2\nexit 1\n"
    )
    (fake_bin / "unshare").chmod(0o755)
    config = tmp_path / "coordinator.toml"
    gsm8k = BASE.format(state=tmp_path / "state").replace('kind = "arithmetic"\ndigits = 2', 'kind = "gsm8k"')
    config.write_text(gsm8k)
    env = {**os.environ, "PATH": f"{fake_bin}{os.pathsep}{os.environ.get('PATH', os.defpath)}", "OMP_NUM_THREADS": "1"}
    server = subprocess.Popen([sys.executable, "-m", "hacfed.server.main", "--config", str(config), "--listen",
                               "127.0.0.1:0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                              cwd=tmp_path, start_new_session=True)
    try:
        out, err = server.communicate(timeout=120)
    except subprocess.TimeoutExpired:  # it started a federation: SIGTERM makes it stop its children
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.communicate()
        pytest.fail("hacfed-server started without network isolation")
    assert server.returncode == 2, out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("hacfed-server: error: the verifier sandbox cannot isolate the network here")
    assert 'network = "off-unsafe"' in lines[0]
    assert not (tmp_path / "state").exists()


def test_a_broken_factory_is_a_clear_start_error() -> None:
    with SandboxedWorker("hacfed.tasks.no_such_module:handler", SandboxLimits(timeout_s=2.0)) as worker:
        with pytest.raises(SandboxStartError, match="ModuleNotFoundError"):
            worker.call({})
    with pytest.raises(ValueError, match="module:function"):
        SandboxedWorker("no colon")
