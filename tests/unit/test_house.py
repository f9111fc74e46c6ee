"""The house rules of include/ivm (STYLE.md), checked on the source: no import cycle between ivm modules
(imports anywhere in a file count: TYPE_CHECKING and function-local ones too), the front end (lang/)
never imports run-time maintenance (maintain/), strategies and modes are never compared as bare strings,
and the examples in the docstrings hold."""

from __future__ import annotations

import ast
import doctest
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "include"


def modules() -> dict[str, Path]:
    out = {}
    for f in (ROOT / "ivm").rglob("*.py"):
        if "migrations" in f.parts:
            continue
        name = ".".join(f.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        out[name] = f
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the ivm modules it imports (a package's module importing its own package excluded)."""
    mods = modules()
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, f in mods.items():
        package = m if f.name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, *([base] if base else [])])
                targets = [base, *(f"{base}.{a.name}" for a in node.names)]
            else:
                continue
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != m and not m.startswith(t + "."):
                    edges[m].add(t)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in edges:
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle():
    edges = import_graph()
    assert "ivm.refresh.stages" in edges and "ivm.context" in edges["ivm.refresh.stages"]  # (the graph is real)
    assert cycles(edges) == []


def test_the_front_end_does_not_import_maintenance():
    edges = import_graph()
    assert [(m, t) for m, ts in edges.items() if m.startswith("ivm.lang") for t in ts
            if t.startswith("ivm.maintain")] == []


BARE = re.compile(r"""[=!]=\s*["'](counting|keyed|reduce|incremental|full|auto)["']"""
                  r"""|["'](counting|keyed|reduce|incremental|full|auto)["']\s*[=!]=""")


def test_strategies_and_modes_are_not_compared_as_strings():
    """They are looked up (ivm.maintain.strategy.REGISTRY) or enum members (ivm.modes.Mode)."""
    found = [f"{f.relative_to(ROOT)}:{n}" for f in modules().values()
             for n, line in enumerate(f.read_text().splitlines(), 1) if BARE.search(line)]
    assert found == []


@pytest.mark.parametrize("module", ["ivm.modes", "ivm.ir", "ivm.maintain.strategy", "ivm.maintain.stats",
                                    "ivm.refresh.record", "ivm.refresh.plan", "ivm.zset", "ivm.lang.allowlist",
                                    "ivm.lang.aggregate_filters", "ivm.lang.grouped_in", "ivm.lang.scalar_subqueries",
                                    "ivm.lang.bag_set_operations", "ivm.lang.window_functions",
                                    "ivm.validate", "ivm.evolution", "ivm.orchestration.dags",
                                    "ivm.orchestration.stages", "ivm.lineage", "ivm.dataflow"])
def test_docstring_examples(module):
    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0 and result.failed == 0
