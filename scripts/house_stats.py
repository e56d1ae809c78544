"""Figures of the house: the import graph of some packages, module and function sizes.

    python scripts/house_stats.py [--src src] [--json]

For each package named in PACKAGES: its modules, the import edges between them (grimp, every
import, ``TYPE_CHECKING`` ones included) and its import circles (strongly connected components
of more than one module). Over all of ``src/``: modules, physical lines, and the AST span of every
``def`` (``end_lineno - lineno + 1``, nested and methods included), as median / p90 / max and the
count over 60 lines: the method of ../shared/reviews/house-2026-11.md, so figures compare.
And the largest classes: attributes (names assigned on ``self`` in its methods, and annotated
names in its body) and methods (``def`` directly in its body), the most first.
"""

from __future__ import annotations

import argparse
import ast
import json
import statistics
import sys
from pathlib import Path

import grimp

PACKAGES = ("arl_tangram.managers.cpu", "arl_tangram.core", "arl_tangram.runtime")


def _circles(nodes: set[str], edges: set[tuple[str, str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    out: dict[str, list[str]] = {n: [] for n in nodes}
    for a, b in edges:
        out[a].append(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in out[v]:
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
                found.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return found


def graph_figures(package: str) -> dict[str, object]:
    graph = grimp.build_graph("arl_tangram", include_external_packages=False)
    nodes = {m for m in graph.modules if m == package or m.startswith(package + ".")}
    edges = {
        (a, b)
        for a in nodes
        for b in graph.find_modules_directly_imported_by(a)
        if b in nodes and a != b
    }
    return {
        "modules": len(nodes),
        "edges": len(edges),
        "circles": _circles(nodes, edges),
    }


def size_figures(src: Path) -> dict[str, object]:
    files = sorted(src.rglob("*.py"))
    lines = [len(f.read_text().splitlines()) for f in files]
    spans: list[int] = []
    for f in files:
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                spans.append(node.end_lineno - node.lineno + 1)  # type: ignore[operator]
    spans.sort()
    return {
        "modules": len(files),
        "lines": sum(lines),
        "median_module": statistics.median(lines),
        "largest_module": max(lines),
        "functions": len(spans),
        "median_fn": statistics.median(spans),
        "p90_fn": spans[int(0.9 * (len(spans) - 1))],
        "max_fn": spans[-1],
        "fns_over_60": sum(s > 60 for s in spans),
    }


def class_figures(src: Path, most: int = 8) -> list[dict[str, object]]:
    """The ``most`` classes with the most attributes plus methods: name, file, both counts."""
    rows: list[dict[str, object]] = []
    for f in sorted(src.rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            methods = [n for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
            attrs = {n.target.id for n in node.body
                     if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
            for m in methods:
                for n in ast.walk(m):
                    targets = n.targets if isinstance(n, ast.Assign) else (
                        [n.target] if isinstance(n, ast.AnnAssign | ast.AugAssign) else [])
                    for t in targets:
                        for e in ast.walk(t):
                            if (isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name)
                                    and e.value.id == "self"):
                                attrs.add(e.attr)
            rows.append({"class": node.name, "file": str(f.relative_to(src.parent)),
                         "attributes": len(attrs), "methods": len(methods)})
    rows.sort(key=lambda r: (-(r["attributes"] + r["methods"]), r["class"]))  # type: ignore[operator]
    return rows[:most]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", default="src")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(args.src).resolve()))
    figures = {
        "graphs": {p: graph_figures(p) for p in PACKAGES},
        "sizes": size_figures(Path(args.src) / "arl_tangram"),
        "classes": class_figures(Path(args.src) / "arl_tangram"),
    }
    if args.json:
        print(json.dumps(figures, indent=1))
        return
    for p, g in figures["graphs"].items():  # type: ignore[attr-defined]
        print(f"{p}: {g['modules']} modules, {g['edges']} import edges, "
              f"{len(g['circles'])} circles")
        for c in g["circles"]:
            print("   circle:", " <-> ".join(m.rsplit(".", 1)[-1] for m in c))
    s = figures["sizes"]
    print(f"src: {s['modules']} modules, {s['lines']} lines, median module {s['median_module']}, "
          f"largest {s['largest_module']}; {s['functions']} functions, median {s['median_fn']}, "
          f"p90 {s['p90_fn']}, max {s['max_fn']}, {s['fns_over_60']} over 60 lines")
    print("largest classes (attributes/methods):")
    for c in figures["classes"]:  # type: ignore[attr-defined]
        print(f"   {c['class']} {c['attributes']}/{c['methods']} ({c['file']})")


if __name__ == "__main__":
    main()
