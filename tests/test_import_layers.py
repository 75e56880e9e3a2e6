"""Import layers: no module of the project imports itself back (function-level imports count:
they are circles all the same, only deferred) — ``optim``, the twin's routing, length-model and
arrival modules, and every other module of ``twin``, ``optim``, ``surrogates`` and
``experiments`` — and ``twin`` never imports the studies in ``experiments``."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _module_graph(packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Module -> the project modules it imports anywhere in its source (``a.b`` for
    ``from a import b`` when ``a.b`` is a module)."""
    mods: dict[str, Path] = {}
    for pkg in packages:
        for p in (REPO / pkg).rglob("*.py"):
            name = ".".join(p.relative_to(REPO).with_suffix("").parts)
            mods[name.removesuffix(".__init__")] = p
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        pkg = m if p.name == "__init__.py" else m.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")[:len(pkg.split(".")) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                names = [target] + [f"{target}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            graph[m] |= {n for n in names if n in mods and n != m}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_optim_has_no_import_circles():
    graph = _module_graph(("optim", "twin", "surrogates"))
    circles = [c for c in _cycles(graph) if any(m.startswith("optim") for m in c)]
    assert circles == []


def test_twin_routing_lengths_and_arrivals_have_no_import_circles():
    graph = _module_graph(("twin",))
    near = ("twin.routing", "twin.lengths", "twin.sharegpt", "twin.length_models",
            "twin.arrivals", "twin.workload")
    assert [c for c in _cycles(graph) if any(m.startswith(near) for m in c)] == []


def test_no_module_of_the_project_imports_itself_back():
    """The whole project: the twin's models and their fits (``twin.latency_tail`` /
    ``latency_tail_fit``, ``twin.headroom`` / ``headroom_fit``) and twin serve's app and CLI
    once formed circles."""
    graph = _module_graph(("twin", "optim", "surrogates", "experiments"))
    assert len(graph) > 100 and graph["twin.server"]       # the graph was read
    assert _cycles(graph) == []


def test_the_twin_never_imports_the_studies():
    graph = _module_graph(("twin", "experiments"))
    bad = {m: sorted(t for t in ts if t.startswith("experiments"))
           for m, ts in graph.items() if m.startswith("twin")}
    assert {m: t for m, t in bad.items() if t} == {}
