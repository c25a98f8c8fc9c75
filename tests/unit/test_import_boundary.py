"""Import boundaries, checked statically: server/ never reaches clients/, clients/ never reaches server/.

Every module's imports are read with `ast` (including imports inside functions, which run just the
same, only later), resolved to first-party modules, and followed transitively, so a module under
server/ that imports a shared hacfed/ module that imports clients/ fails too. Shared hacfed/ modules
import neither side, nor the all-in-one tool (`hacfed.tools`), which is the one package that starts
both sides; no module outside it may import it. Only the
wire family touches generated protobuf code (docs/style.md rule 6). The coordinator's side also never
reaches torch, transformers or vLLM (docs/design.md; test_coordinator_state.py's
`test_coordinator_never_imports_torch` checks the same at run time).
"""

from __future__ import annotations

import ast
from collections import deque
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# folder -> installed package (pyproject's package-dir)
FOLDERS = {"hacfed": "hacfed", "server": "hacfed.server", "clients": "hacfed.clients", "proto": "hacfed.proto"}
SERVER, CLIENTS = "hacfed.server", "hacfed.clients"
TOOL = "hacfed.tools"
WIRE = "hacfed.wire"
HEAVY = ("torch", "transformers", "vllm", "peft", "accelerate")


@dataclass(frozen=True)
class Import:
    target: str  # the imported module, absolute (first-party modules resolved to a module that exists)
    path: Path  # the importing file
    line: int

    def where(self, root: Path) -> str:
        return f"{self.path.relative_to(root)}:{self.line}"


def module_files(root: Path, folders: dict[str, str]) -> dict[str, Path]:
    """Module name -> file, for every .py file of the mapped folders."""
    found: dict[str, Path] = {}
    for folder, package in folders.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = path.relative_to(root / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> list[Import]:
    """What `name` (at `path`) imports: first-party targets resolved to existing modules, plus the
    packages above them (importing a.b.c runs a/__init__ and a/b/__init__ first)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[Import] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pkg import mod` imports the module pkg.mod; `from mod import name` only mod
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        for target in targets:
            for module in [*_parents(target), target]:
                found.append(Import(module, path, node.lineno))
    return found


def import_graph(root: Path = ROOT, folders: dict[str, str] = FOLDERS) -> dict[str, list[Import]]:
    modules = module_files(root, folders)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def reach(graph: dict[str, list[Import]], start: str) -> dict[str, list[Import]]:
    """Every module `start` imports, directly or not, with the chain of imports that gets there."""
    chains: dict[str, list[Import]] = {start: []}
    queue = deque([start])
    while queue:
        module = queue.popleft()
        for imp in graph.get(module, []):
            if imp.target not in chains:
                chains[imp.target] = [*chains[module], imp]
                if imp.target in graph:
                    queue.append(imp.target)
    return chains


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def violations(graph: dict[str, list[Import]], root: Path = ROOT) -> list[str]:
    """One line per broken rule: the importing file and line, and the chain when it is indirect."""
    rules = [
        (SERVER, lambda m: _inside(m, CLIENTS), "server/ must not import clients/"),
        (CLIENTS, lambda m: _inside(m, SERVER), "clients/ must not import server/"),
        (SERVER, lambda m: m.split(".")[0] in HEAVY, "the coordinator's side never imports torch and co."),
    ]
    found: list[str] = []
    for name in sorted(graph):
        for side, forbidden, rule in rules:
            if not _inside(name, side):
                continue
            crossings: dict[tuple[str, str], list[Import]] = {}  # one per (first, last) import statement
            for target, chain in sorted(reach(graph, name).items()):
                if forbidden(target) and not any(forbidden(i.target) for i in chain[:-1]):
                    key = (chain[0].where(root), chain[-1].where(root))
                    if key not in crossings or len(target) > len(crossings[key][-1].target):
                        crossings[key] = chain  # `import a.b.c` reaches a, a.b and a.b.c: name a.b.c
            for chain in crossings.values():
                steps = " -> ".join(f"{i.target} ({i.where(root)})" for i in chain)
                found.append(f"{chain[0].where(root)}: {rule}: {name} -> {steps}")
        shared = name.startswith("hacfed.") and not _inside(name, SERVER) and not _inside(name, CLIENTS) \
            and not _inside(name, "hacfed.proto") and not _inside(name, TOOL)
        for imp in graph[name]:
            if shared and (_inside(imp.target, SERVER) or _inside(imp.target, CLIENTS)):
                found.append(f"{imp.where(root)}: shared hacfed/ modules import neither side: {name} imports "
                             f"{imp.target}")
            if not _inside(name, TOOL) and _inside(imp.target, TOOL):
                found.append(f"{imp.where(root)}: only the tool imports hacfed.tools: {name} imports {imp.target}")
            if imp.target.endswith("_pb2") or imp.target.endswith("_pb2_grpc"):
                if not (_inside(name, WIRE) or _inside(name, "hacfed.proto")):
                    found.append(f"{imp.where(root)}: only hacfed.wire imports generated protobuf code: "
                                 f"{name} imports {imp.target}")
    return found


def test_server_and_clients_stay_apart() -> None:
    graph = import_graph()
    assert any(_inside(m, SERVER) for m in graph) and any(_inside(m, CLIENTS) for m in graph)
    problems = violations(graph)
    assert not problems, "import boundary broken:\n" + "\n".join(problems)


def test_the_checker_names_file_and_line_of_a_crossing(tmp_path: Path) -> None:
    files = {
        "server/__init__.py": "",
        "server/driver.py": "import json\n\nfrom hacfed.shared import helper\n",
        "hacfed/__init__.py": "",
        "hacfed/shared.py": "def helper():\n    from hacfed.clients import relay  # lazy, still an import\n",
        "hacfed/wirefree.py": "from hacfed.proto import hacfed_v1_pb2\n",
        "hacfed/uses_tool.py": "from hacfed.tools import sim\n",
        "hacfed/tools/__init__.py": "",
        "hacfed/tools/sim.py": "from hacfed.clients import relay\nfrom hacfed.server import driver\n",
        "clients/__init__.py": "",
        "clients/relay.py": "from hacfed.server.driver import x\n",
        "proto/__init__.py": "",
        "proto/hacfed_v1_pb2.py": "",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    problems = "\n".join(violations(import_graph(tmp_path), tmp_path))
    assert "server/driver.py:3: server/ must not import clients/: hacfed.server.driver -> hacfed.shared" in problems
    assert "hacfed.clients.relay (hacfed/shared.py:2)" in problems
    assert "clients/relay.py:1: clients/ must not import server/" in problems
    assert "hacfed/shared.py:2: shared hacfed/ modules import neither side" in problems
    assert "hacfed/wirefree.py:1: only hacfed.wire imports generated protobuf code" in problems
    assert "hacfed/uses_tool.py:1: only the tool imports hacfed.tools" in problems
    assert "hacfed/tools/sim.py" not in problems  # the tool may start both sides

