"""Every `.md` file that code or docs cite exists in the clone; docs carry no diary (docs/style.md rule 19).

Scanned: code (*.py, *.sh, *.toml, *.yaml, *.yml) and every Markdown file of the clone, outside
hidden folders (.venv, .git, caches) and the ignored output folders (runs/, state/, build/, dist/).
A mention of a `.md` file resolves against the citing file's folder, the repository root or docs/
(so `hacpo.md`, `docs/hacpo.md` and `../docs/hacpo.md` all name docs/hacpo.md); a Markdown link
target `[text](PAGE)` resolves against the citing file's folder only, as a renderer does. Not
references: URLs, outputs under runs/ or state/, and a path built in code (`tmp_path / "r.md"`).
The clone must also stand alone: no file names the machine's shared folder, and the README and
docs/ carry no "stop N" (a work session's number), which git's history keeps instead.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CODE_SUFFIXES = (".py", ".sh", ".toml", ".yaml", ".yml")
SKIPPED_DIRS = {"runs", "state", "build", "dist", "__pycache__", "node_modules"}
OUTPUT_PREFIXES = ("runs/", "state/")
URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S+")
MENTION = re.compile(r"(?<![\w.$/-])((?:\.{1,2}/)*[\w-][\w./-]*?\.md)(?![\w-])")
LINK = re.compile(r"\]\(([^)\s#]+\.md)(?:#[^)]*)?\)")
# Assembled so that this file does not name them itself.
SHARED = ("../" + "shared", "shared" + "/docs")
DIARY = re.compile(r"\b[Ss]tops? \d+|\b[Ss]top-\d+")


def scanned_files(root: Path) -> list[Path]:
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIPPED_DIRS
                         and not d.endswith(".egg-info"))
        found += [Path(folder) / f for f in sorted(files) if f.endswith(CODE_SUFFIXES + (".md",))]
    return found


def _built_in_code(text: str, start: int) -> bool:
    """`tmp_path / "r.md"`: the mention is a string joined onto a path, a file the code writes."""
    before = text[:start]
    return before[-1:] in "\"'" and before[:-1].rstrip().endswith("/")


def broken_refs(path: Path, root: Path) -> list[str]:
    """'file:line: NAME' for each `.md` file `path` cites that does not exist under `root`."""
    text = path.read_text(encoding="utf-8", errors="replace")
    plain = URL.sub(lambda m: " " * len(m.group()), text)
    folder = path.parent
    problems = []

    def check(name: str, start: int, bases: tuple[Path, ...]) -> None:
        if name.startswith(OUTPUT_PREFIXES) or any((base / name).is_file() for base in bases):
            return
        line = text.count("\n", 0, start) + 1
        problems.append(f"{path.relative_to(root)}:{line}: {name}")

    links = set()
    if path.suffix == ".md":
        for match in LINK.finditer(plain):
            links.add(match.start(1))
            check(match.group(1), match.start(1), (folder,))
    for match in MENTION.finditer(plain):
        if match.start(1) in links or _built_in_code(plain, match.start(1)):
            continue
        check(match.group(1), match.start(1), (folder, root, root / "docs"))
    return sorted(set(problems))


def shared_mentions(path: Path, root: Path) -> list[str]:
    text = path.read_text(encoding="utf-8", errors="replace")
    return [f"{path.relative_to(root)}:{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1)
            if any(s in line for s in SHARED)]


def diary_mentions(path: Path, root: Path) -> list[str]:
    text = path.read_text(encoding="utf-8", errors="replace")
    return [f"{path.relative_to(root)}:{n}: {m.group()}" for n, line in enumerate(text.splitlines(), 1)
            for m in DIARY.finditer(line)]


def test_every_cited_md_file_exists():
    problems = [p for f in scanned_files(ROOT) for p in broken_refs(f, ROOT)]
    assert not problems, "cited .md files that do not exist:\n" + "\n".join(problems)


def test_nothing_names_the_shared_folder():
    problems = [p for f in scanned_files(ROOT) for p in shared_mentions(f, ROOT)]
    assert not problems, "the clone must stand alone:\n" + "\n".join(problems)


def test_readme_and_docs_carry_no_stop_numbers():
    docs = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
    problems = [p for f in docs for p in diary_mentions(f, ROOT)]
    assert not problems, "describe the code as it is, not the session that wrote it:\n" + "\n".join(problems)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "hacpo.md").write_text("# HACPO\n")
    (tmp_path / "README.md").write_text("see [the math](docs/hacpo.md) and `docs/hacpo.md`\n")
    return tmp_path


def test_the_checks_find_what_they_look_for(tree: Path):
    missing = "nowhere" + ".md"
    (tree / "pkg").mkdir()
    code = tree / "pkg" / "mod.py"
    code.write_text(f'"""Cites hacpo.md §2, docs/hacpo.md, ../docs/hacpo.md and {missing}."""\n'
                    'OUT = tmp_path / "written.md"  # a file the code writes\n'
                    'RESULTS = "runs/x/report.md"\n'
                    '# https://example.org/elsewhere.md\n')
    assert broken_refs(code, tree) == [f"pkg/mod.py:1: {missing}"]
    assert broken_refs(tree / "README.md", tree) == []
    # A Markdown link resolves against its own folder: docs/ linking `docs/hacpo.md` is broken.
    page = tree / "docs" / ("page" + ".md")
    page.write_text("[ok](hacpo.md) [broken](docs/hacpo.md#section)\n")
    assert broken_refs(page, tree) == [f"docs/{page.name}:1: docs/hacpo.md"]
    page.write_text("Measured in stop 27; see " + SHARED[0] + "/docs/x.md\nStop 3 and stop-4; stops 26-27\n")
    assert len(diary_mentions(page, tree)) == 4
    assert len(shared_mentions(page, tree)) == 1
    assert [p.name for p in scanned_files(tree)] == ["README.md", "hacpo.md", page.name, "mod.py"]
