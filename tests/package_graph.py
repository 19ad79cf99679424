"""The import graph of the fastcollate package, read from the code (every import statement, at
module level or inside a function): which module imports which, the packages' graph drawn in
layers, the import circles (there must be none) and module file names used twice (none either).

``python tests/package_graph.py`` rewrites docs/design/packages.md; tests/test_layout.py checks
that the page is what the code gives, so the picture stays true."""
from __future__ import annotations

import ast
import collections
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "fastcollate")
PAGE = os.path.join(ROOT, "docs", "design", "packages.md")
FACADE = "fastcollate"  # the package's own __init__: the public names, imported by nobody inside


def modules() -> dict[str, str]:
    """Module name -> file, for every .py file of the package."""
    out = {}
    for dirpath, dirnames, files in os.walk(PKG):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                out[name.removesuffix(".__init__")] = path
    return out


def _targets(name: str, path: str, node: ast.AST, known: dict[str, str]) -> list[str]:
    if isinstance(node, ast.Import):
        wanted = [a.name for a in node.names]
    else:
        assert isinstance(node, ast.ImportFrom)
        if node.level:
            base = name if path.endswith("__init__.py") else name.rsplit(".", 1)[0]
            parts = base.split(".")
            parts = parts[:len(parts) - (node.level - 1)]
            src = ".".join(parts + ([node.module] if node.module else []))
        else:
            src = node.module or ""
        # "from pkg import mod" names a module; "from mod import name" names the module
        wanted = [f"{src}.{a.name}" if f"{src}.{a.name}" in known else src for a in node.names]
    out = []
    for w in wanted:
        while w and w not in known and "." in w:
            w = w.rsplit(".", 1)[0]
        if w in known and w != name:
            out.append(w)
    return out


def edges() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (the facade left out on both sides)."""
    known = modules()
    out: dict[str, set[str]] = {m: set() for m in known if m != FACADE}
    for name, path in known.items():
        if name == FACADE:
            continue
        for node in ast.walk(ast.parse(open(path).read(), path)):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                out[name].update(t for t in _targets(name, path, node, known) if t != FACADE)
    return out


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def twice_named() -> dict[str, list[str]]:
    """Module file names (not __init__ / __main__) used by more than one file."""
    seen = collections.defaultdict(list)
    for name, path in modules().items():
        base = os.path.basename(path)
        if base not in ("__init__.py", "__main__.py"):
            seen[base].append(os.path.relpath(path, ROOT))
    return {k: v for k, v in seen.items() if len(v) > 1}


def package_of(module: str) -> str:
    """A module's package (``doctor`` for fastcollate.doctor.plan); a module at the top of the
    package is a node of its own (``cli``, ``ray``, ``_ext``)."""
    return module.split(".")[1]


def package_graph() -> dict[str, set[str]]:
    out: dict[str, set[str]] = collections.defaultdict(set)
    for m, targets in edges().items():
        p = package_of(m)
        out[p]
        for t in targets:
            q = package_of(t)
            if q != p:
                out[p].add(q)
    return dict(out)


def layers(graph: dict[str, set[str]]) -> list[list[str]]:
    """Packages in layers, each above everything it imports; packages that import each other
    share a layer (the graph's strongly connected parts, drawn as one)."""
    nodes = sorted(set(graph) | {q for qs in graph.values() for q in qs})
    part = {v: v for v in nodes}
    for comp in circles({v: set(graph.get(v, ())) for v in nodes}):
        for v in comp:
            part[v] = comp[0]
    below: dict[str, set[str]] = collections.defaultdict(set)
    for p in nodes:
        below[part[p]].update(part[q] for q in graph.get(p, ()) if part[q] != part[p])
    depth: dict[str, int] = {}

    def d(p: str) -> int:
        if p not in depth:
            depth[p] = 1 + max((d(q) for q in sorted(below[p])), default=-1)
        return depth[p]

    rows: dict[int, list[str]] = collections.defaultdict(list)
    for p in nodes:
        rows[d(part[p])].append(p)
    return [sorted(rows[k]) for k in sorted(rows)]


def page() -> str:
    graph = package_graph()
    mods = edges()
    two_way = sorted({tuple(sorted((p, q))) for p, qs in graph.items() for q in qs if p in graph.get(q, ())})
    lines = ["# The package graph", "",
             "Generated by `python tests/package_graph.py` from the code's import statements; "
             "`tests/test_layout.py` fails when this page is stale.", "",
             f"{len(mods)} modules; {len(graph)} packages and top-level modules, each drawn above what it imports.", "",
             "```text"]
    rows = layers(graph)
    for k, row in reversed(list(enumerate(rows))):
        lines.append(f"layer {k}:  " + "   ".join(row))
    lines += ["```", "", "| package | imports |", "|---|---|"]
    for p in sorted(graph):
        lines.append(f"| {p} | {', '.join(sorted(graph[p])) or '-'} |")
    lines.append("")
    if two_way:
        lines.append("Two packages import each other, through one module each way:")
        lines.append("")
        for p, q in two_way:
            ab = sorted({f"{m} -> {t}" for m, ts in mods.items() for t in ts
                         if {package_of(m), package_of(t)} == {p, q}})
            lines.append(f"- {p} and {q}: " + "; ".join(f"`{e}`" for e in ab) + ".")
        lines.append("")
    found = circles(mods)
    lines.append("Import circles between modules: " + ("none." if not found else
                                                       "; ".join(" <-> ".join(c) for c in found) + "."))
    twice = twice_named()
    lines.append("")
    lines.append("Module file names used twice: " + ("none." if not twice else ", ".join(sorted(twice)) + "."))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    with open(PAGE, "w") as f:
        f.write(page())
    print(page())
