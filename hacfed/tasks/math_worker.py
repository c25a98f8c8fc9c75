"""The sandboxed math-verify worker: what `hacfed.tasks.math_verifier` asks when its in-process
steps cannot decide a (gold, answer) pair.

Runs only inside a `hacfed.tasks.sandbox.SandboxedWorker` process, started by the factory path
`hacfed.tasks.math_verifier.WORKER_FACTORY`; math-verify (and sympy) are imported there, never in
the caller's process. Both sides are parsed with math-verify's LaTeX parser only (no
`ExprExtractionConfig`, which goes through sympy's `parse_expr`/`eval`).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Callable


def worker_handler() -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Runs inside the sandboxed worker only: import math-verify, warm it up, return the handler.

    math-verify's own signal timeouts are off (None): the sandbox arms one SIGALRM per request
    instead, with float precision, and the parent's wall timeout backs it up."""
    from math_verify import LatexExtractionConfig, parse, verify

    extraction = [LatexExtractionConfig()]

    def parse_boxed(text: str) -> list[Any]:
        return parse("\\boxed{" + text + "}", extraction_config=extraction, parsing_timeout=None)

    parse_gold = lru_cache(maxsize=4096)(parse_boxed)

    def handle(request: dict[str, Any]) -> dict[str, Any]:
        gold, answer = request.get("gold"), request.get("answer")
        if not isinstance(gold, str) or not isinstance(answer, str):
            return {"equal": False, "note": "malformed request"}
        gold_parsed = parse_gold(gold)
        if not gold_parsed:
            return {"equal": False, "note": "gold answer unparseable"}
        answer_parsed = parse_boxed(answer)
        if not answer_parsed:
            return {"equal": False, "note": "answer unparseable"}
        return {"equal": bool(verify(gold_parsed, answer_parsed, timeout_seconds=None))}

    # Load the grammar and sympy's lazily imported modules now, so a first real item is not charged
    # for them against its timeout (a spurious 0 the participant's own verifier would not give).
    for gold, answer in (("\\frac{1}{2}", "0.5"), ("x^2+2x+1", "(x+1)^2"), ("\\sqrt{2}/2", "\\frac{1}{\\sqrt{2}}")):
        warm = handle({"gold": gold, "answer": answer})
        if warm.get("equal") is not True:
            raise RuntimeError(f"math-verify warm-up failed on {gold!r}: {warm}")
    parse_gold.cache_clear()
    return handle
