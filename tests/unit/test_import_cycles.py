"""No import cycles among first-party modules, lazy (function-level) imports included.

A lazy import only hides a cycle from Python's loader: the two modules still depend on each other,
and the reader cannot tell which one is the lower layer. The graph is the one the boundary test
builds (`test_import_boundary.import_graph`); a submodule's implicit import of its own parent
package is not an edge.
"""

from __future__ import annotations

from pathlib import Path

from tests.unit.test_import_boundary import import_graph


def module_edges(graph) -> dict[str, list[str]]:
    modules = set(graph)
    return {m: sorted({i.target for i in graph[m] if i.target in modules and i.target != m
                       and not m.startswith(i.target + ".")}) for m in graph}


def cycles(edges: dict[str, list[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            targets = edges[node]
            if i < len(targets):
                work.append((node, i + 1))
                nxt = targets[i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return found


def test_no_import_cycles() -> None:
    found = cycles(module_edges(import_graph()))
    assert not found, "import cycles (lazy imports count):\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_cycle_finder_finds_a_lazy_cycle(tmp_path: Path) -> None:
    files = {
        "hacfed/__init__.py": "",
        "hacfed/a.py": "from hacfed import b\n",
        "hacfed/b.py": "def f():\n    from hacfed.c import x  # lazy\n",
        "hacfed/c.py": "import hacfed.a\n",
        "hacfed/d.py": "import hacfed.a\n",
        "hacfed/pkg/__init__.py": "",
        "hacfed/pkg/child.py": "import hacfed.pkg\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    found = cycles(module_edges(import_graph(tmp_path, {"hacfed": "hacfed"})))
    assert found == [["hacfed.a", "hacfed.b", "hacfed.c"]]
