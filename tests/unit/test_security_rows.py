"""docs/security.md cites only tests that exist, and its two tables hold every row with a proof and a status.

A citation is a code span naming a test file under tests/ (`unit/test_x.py`, `faults/test_y.py`,
`integration/test_z.py`, or a bare `test_x.py` found under tests/), optionally with `::test_name`; a
span `::test_name` alone continues the file cited last. Each file must exist, and each test must be a
function (or a method of a test class) of that file. The tables "Security rows" and "Reliability
rows" must hold S1-S14 and R1-R11, each with at least one cited test in its Proof column and a
status of the fixed set in bold.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "security.md"
TESTS = ROOT / "tests"
SPAN = re.compile(r"`([^`\n]+)`")
CITED = re.compile(r"^(?:tests/)?((?:[\w-]+/)*test_\w+\.py)(?:::(\w+)(?:\[[^\]]*\])?)?$")
CONTINUED = re.compile(r"^::(\w+)(?:\[[^\]]*\])?$")
STATUSES = ("green", "partly met", "deviates by design", "not met")
ROWS = [f"S{n}" for n in range(1, 15)] + [f"R{n}" for n in range(1, 12)]


@cache
def _defined(path: Path) -> frozenset[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.update(n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
    return frozenset(names)


def _resolve(name: str, tests: Path) -> Path | None:
    if "/" in name:
        path = tests / name
        return path if path.is_file() else None
    found = sorted(tests.rglob(name))
    return found[0] if len(found) == 1 else None


def citations(text: str) -> list[tuple[int, str, str | None]]:
    """(line, file, test or None) for every test citation in `text`, in order."""
    out: list[tuple[int, str, str | None]] = []
    current: str | None = None
    for match in SPAN.finditer(text):
        span, line = match.group(1).strip(), text.count("\n", 0, match.start()) + 1
        if cited := CITED.match(span):
            current = cited.group(1)
            out.append((line, current, cited.group(2)))
        elif (continued := CONTINUED.match(span)) and current is not None:
            out.append((line, current, continued.group(1)))
    return out


def missing_citations(text: str, tests: Path) -> list[str]:
    problems = []
    for line, name, test in citations(text):
        path = _resolve(name, tests)
        if path is None:
            problems.append(f"line {line}: no test file {name}")
        elif test is not None and test not in _defined(path):
            problems.append(f"line {line}: {name} has no test {test}")
    return problems


def table_rows(text: str) -> dict[str, list[str]]:
    """Row id -> its cells, for the rows of the form `| **S1** goal | ... |`."""
    rows = {}
    for line in text.splitlines():
        if found := re.match(r"\|\s*\*\*([SR]\d+)\*\*", line):
            rows[found.group(1)] = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
    return rows


def row_problems(text: str, tests: Path) -> list[str]:
    rows, problems = table_rows(text), []
    for row in ROWS:
        cells = rows.get(row)
        if cells is None:
            problems.append(f"{row}: not in the tables")
            continue
        if len(cells) != 5:
            problems.append(f"{row}: {len(cells)} cells, not 5 (row, goal, what hacfed does, proof, status)")
            continue
        if not any(test is not None for _, _, test in citations(cells[3])):
            problems.append(f"{row}: its Proof column cites no test")
        if not re.match(rf"\*\*({'|'.join(STATUSES)})\*\*", cells[4]):
            problems.append(f"{row}: its status does not start with one of {STATUSES} in bold")
    return problems


def test_every_test_security_md_cites_exists():
    problems = missing_citations(DOC.read_text(encoding="utf-8"), TESTS)
    assert not problems, "docs/security.md cites tests that do not exist:\n" + "\n".join(problems)


def test_every_row_has_a_proof_and_a_status():
    problems = row_problems(DOC.read_text(encoding="utf-8"), TESTS)
    assert not problems, "docs/security.md's tables:\n" + "\n".join(problems)


@pytest.fixture
def tests_dir(tmp_path: Path) -> Path:
    (tmp_path / "unit").mkdir()
    (tmp_path / "unit" / "test_a.py").write_text("def test_one():\n    pass\n\n\nclass TestB:\n"
                                                 "    def test_two(self):\n        pass\n")
    return tmp_path


def test_the_checks_find_what_they_look_for(tests_dir: Path):
    good = "`unit/test_a.py::test_one`, `::test_two`, `test_a.py`, `tests/unit/test_a.py::test_one[x]`"
    assert missing_citations(good, tests_dir) == []
    bad = "`unit/test_a.py::test_one`, `::test_gone`\n`unit/test_nowhere.py::test_one`, `faults/test_x.py`"
    assert missing_citations(bad, tests_dir) == ["line 1: unit/test_a.py has no test test_gone",
                                                 "line 2: no test file unit/test_nowhere.py",
                                                 "line 2: no test file faults/test_x.py"]
    table = ("| **S1** x | goal | does | `unit/test_a.py::test_one` | **green** |\n"
             "| **S2** x | goal | does | none | **green** |\n"
             "| **S3** x | goal | does | `unit/test_a.py::test_one` | fine |\n")
    problems = row_problems(table, tests_dir)
    assert problems[:2] == ["S2: its Proof column cites no test",
                            f"S3: its status does not start with one of {STATUSES} in bold"]
    assert "S4: not in the tables" in problems and not any(p.startswith("S1:") for p in problems)


THREAT_ID = re.compile(r"\bT(1[0-2]|[1-9])\b")
QUOTED_SECTION = re.compile(r'security\.md,? "([^"]+)"')


def _shipped_sources() -> list[tuple[Path, str]]:
    return [(p, p.read_text(encoding="utf-8")) for top in ("hacfed", "server", "clients")
            for p in sorted((ROOT / top).rglob("*.py")) if "_pb2" not in p.name]


def test_every_threat_id_and_section_the_code_cites_is_in_security_md() -> None:
    text = DOC.read_text(encoding="utf-8")
    table = {m.group(1) for m in re.finditer(r"^\| T(\d+) \|", text, re.M)}
    headings = {line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#")}
    missing = []
    for path, source in _shipped_sources():
        for comment in re.findall(r"#[^\n]*|\"\"\"[\s\S]*?\"\"\"", source):
            flat = " ".join(comment.split())
            missing += [f"{path.relative_to(ROOT)}: T{n}" for n in THREAT_ID.findall(flat) if n not in table]
            missing += [f"{path.relative_to(ROOT)}: \"{name}\"" for name in QUOTED_SECTION.findall(flat)
                        if not any(h.startswith(name) for h in headings)]
    assert table == {str(n) for n in range(1, 13)}, f"the threat table holds T{sorted(table)}"
    assert not missing, "cited but not in docs/security.md:\n" + "\n".join(missing)
