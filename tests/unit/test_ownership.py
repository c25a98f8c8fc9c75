"""Each class owns its state (docs/style.md rule 16), checked statically over the shipped code
(`hacfed/`, `server/`, `clients/`; tests and benches may look inside what they test):

- no `obj._name` where `_name` is a private attribute or method of a hacfed class of another module
  (`self._x` and `cls._x` are the owner's own; a module may read its own classes' privates on another
  instance of them, unless a class of another module has a private of that name too: the checker
  cannot tell whose it is);
- no `from hacfed... import _name`;
- no Protocol that declares a private (`_name`) member: a collaborator's interface is public;
- no free function that takes its owner typed `Any`: a parameter named after a hacfed class (e.g.
  `coordinator: Any`) whose state the function reads (two or more attributes it does not call) is that
  class's method living elsewhere, or a collaborator that must name the type it depends on.

There is no exceptions list: a finding is fixed in the code.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("hacfed", "server", "clients")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


@dataclass(frozen=True)
class Module:
    path: str
    tree: ast.Module


def shipped_modules(root: Path = ROOT) -> list[Module]:
    files = sorted(p for top in SHIPPED for p in (root / top).rglob("*.py") if "_pb2" not in p.name)
    return [Module(str(p.relative_to(root)), ast.parse(p.read_text(encoding="utf-8"), filename=str(p)))
            for p in files]


def private_members(module: Module) -> set[str]:
    """The private attributes and methods the classes of `module` define."""
    found: set[str] = set()
    for cls in (n for n in ast.walk(module.tree) if isinstance(n, ast.ClassDef)):
        for node in ast.walk(cls):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(node.name):
                found.add(node.name)
            elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _private(node.attr)
                  and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.add(node.attr)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and _private(node.target.id):
                found.add(node.target.id)
    return found


def class_names(modules: list[Module]) -> set[str]:
    return {n.name for m in modules for n in ast.walk(m.tree) if isinstance(n, ast.ClassDef)}


def findings(modules: list[Module]) -> list[str]:
    """Every breach of the rules in the module docstring, as 'path:line: what'."""
    own = {m.path: private_members(m) for m in modules}
    owners: dict[str, set[str]] = {}
    for path, names in own.items():
        for name in names:
            owners.setdefault(name, set()).add(path)
    owner_params = {_snake(c): c for c in class_names(modules)}
    out = []
    for m in modules:
        for node in ast.walk(m.tree):
            where = f"{m.path}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Attribute) and _private(node.attr):
                is_self = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
                others = owners.get(node.attr, set()) - {m.path}
                if not is_self and others:
                    out.append(f"{where}: .{node.attr} belongs to {', '.join(sorted(others))}")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "hacfed":
                out += [f"{where}: imports {node.module}.{a.name}" for a in node.names if _private(a.name)]
            elif isinstance(node, ast.ClassDef) and any(
                    (isinstance(b, ast.Name) and b.id == "Protocol") or (isinstance(b, ast.Attribute)
                                                                       and b.attr == "Protocol")
                    for b in node.bases):
                for item in node.body:
                    name = (item.target.id if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                            else getattr(item, "name", ""))
                    if _private(name):
                        out.append(f"{where}: Protocol {node.name} declares {name}")
        for func in (n for n in m.tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for arg in (*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs):
                if (arg.arg in owner_params and isinstance(arg.annotation, ast.Name)
                        and arg.annotation.id == "Any" and len(state_read(func, arg.arg)) >= 2):
                    out.append(f"{m.path}:{func.lineno}: {func.name} takes its owner {arg.arg}: Any "
                               f"(a method of {owner_params[arg.arg]})")
    return out


def state_read(func: ast.AST, name: str) -> set[str]:
    """The attributes of the variable `name` that `func` reads without calling them."""
    called = {id(n.func) for n in ast.walk(func) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
    return {n.attr for n in ast.walk(func) if isinstance(n, ast.Attribute) and id(n) not in called
            and isinstance(n.value, ast.Name) and n.value.id == name}


def test_shipped_code_keeps_each_class_state_its_own() -> None:
    found = findings(shipped_modules())
    assert not found, "a class's private state used from outside it (docs/style.md rule 16):\n" + "\n".join(found)


def _modules(**sources: str) -> list[Module]:
    return [Module(path, ast.parse(text)) for path, text in sources.items()]


def test_the_checker_finds_each_kind_of_breach() -> None:
    journal = ("class Journal:\n    def __init__(self):\n        self._db = 1\n"
               "    def _tx(self):\n        return self._db\n")
    found = findings(_modules(**{
        "server/journal.py": journal,
        "server/reach.py": "def f(journal):\n    return journal._db, journal._tx()\n",
        "server/same_name.py": ("class Cache:\n    def __init__(self, journal):\n"
                                "        self._db = journal._db\n"),
        "server/imports.py": "from hacfed.server.journal import _helper\n",
        "clients/proto.py": "from typing import Protocol\nclass P(Protocol):\n    _own: dict\n    def _go(self): ...\n",
        "server/free.py": ("from typing import Any\ndef quorum_of(journal: Any, r: int):\n"
                           "    return journal.cfg, journal.joined.get(r)\n"),
    }))
    assert sorted(f.split(": ", 1)[1] for f in found) == sorted([
        "._db belongs to server/journal.py, server/same_name.py",
        "._tx belongs to server/journal.py",
        "._db belongs to server/journal.py",  # Cache has a _db of its own, but not that one
        "imports hacfed.server.journal._helper",
        "Protocol P declares _own",
        "Protocol P declares _go",
        "quorum_of takes its owner journal: Any (a method of Journal)",
    ])


def test_the_checker_lets_an_owner_use_its_own_state_and_others_their_public_api() -> None:
    found = findings(_modules(**{
        "server/journal.py": ("class Journal:\n    def __init__(self):\n        self._db = 1\n"
                              "    def __eq__(self, other):\n        return self._db == other._db\n"),
        "server/user.py": ("import os, sys\nfrom typing import Any\n"
                           "def f(journal: 'Journal', x: Any):\n    os._exit(0)\n"
                           "    return journal.db, sys._getframe()\n"
                           "def g(journal: Any):\n    return journal.read(journal.cfg)\n"),
    }))
    assert found == []
