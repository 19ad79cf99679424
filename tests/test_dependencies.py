"""What pyproject.toml declares covers what the code imports, read statically (no install, no import).

The rule, from how the package loads:

- a module is *eager* when ``import fastcollate`` or an entry point (``[project.scripts]``,
  ``python -m fastcollate``) runs it: ``fastcollate/__init__.py``, the CLI, and every module they
  import at module level, transitively. A third-party module an eager module imports at module
  level must be in ``[project] dependencies``: a plain ``pip install fastcollate`` has nothing else.
- any other module is an *optional adapter*, loaded only when asked for (``fastcollate.ray``
  through the package's ``__getattr__``; ``fastcollate._bench``, imported inside the CLI's
  functions): its module-level imports must be declared in the dependencies or in some extra.
- an import inside a function, or inside a ``try`` (the block that handles its absence), is lazy
  or guarded: the code that runs it says what to install.
"""
from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parent.parent
PKG = "fastcollate"


def pyproject() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]


def dist_name(requirement: str) -> str:
    """The normalized distribution name of a requirement string ('ray[data]>=2.47' -> 'ray')."""
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    assert m, requirement
    return re.sub(r"[-_.]+", "-", m.group(1)).lower()


def declared(requirements: list[str]) -> set[str]:
    return {dist_name(r) for r in requirements}


_DISTS = importlib.metadata.packages_distributions()


def distribution_of(top_module: str) -> set[str]:
    """The distributions that provide an import name (PIL -> pillow); the name itself if none is installed."""
    return {dist_name(d) for d in _DISTS.get(top_module, [top_module])}


def module_files() -> dict[str, Path]:
    out = {}
    for path in (ROOT / PKG).rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = module_files()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def eager_statements(body: list[ast.stmt]):
    """The import statements a module runs when it is imported: its body, the branches of its
    ifs (not ``if TYPE_CHECKING``), withs and class bodies; not functions, not try blocks."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            if "TYPE_CHECKING" not in ast.unparse(node.test):
                yield from eager_statements(node.body)
                yield from eager_statements(node.orelse)
        elif isinstance(node, (ast.With, ast.ClassDef)):
            yield from eager_statements(node.body)


def imports_of(name: str) -> tuple[set[str], set[str]]:
    """(modules of this package, top-level third-party names) that module ``name`` imports when loaded."""
    tree = ast.parse(MODULES[name].read_text(), str(MODULES[name]))
    ours, theirs = set(), set()
    package = name if _is_package(name) else name.rpartition(".")[0]
    for node in eager_statements(tree.body):
        if isinstance(node, ast.Import):
            targets = [(a.name, None) for a in node.names]
        elif node.level:
            base = package.split(".")
            base = ".".join(base[:len(base) - node.level + 1] + ([node.module] if node.module else []))
            targets = [(base, [a.name for a in node.names])]
        else:
            targets = [(node.module, [a.name for a in node.names])]
        for module, names in targets:
            top = module.split(".")[0]
            if top == PKG:
                parts = module.split(".")
                ours |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)}  # parents run first
                ours |= {f"{module}.{n}" for n in names or () if f"{module}.{n}" in MODULES}  # from . import sub
            elif top != "__future__" and top not in sys.stdlib_module_names:
                theirs.add(top)
    return {m for m in ours if m in MODULES}, theirs


def entry_modules() -> set[str]:
    scripts = {spec.split(":")[0] for spec in pyproject().get("scripts", {}).values()}
    return {PKG, f"{PKG}.__main__"} | scripts


def eager_modules() -> set[str]:
    seen, todo = set(), list(entry_modules())
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo += imports_of(name)[0] - seen
    return seen


def test_the_rule_sees_the_package_as_it_loads():
    eager = eager_modules()
    assert {"fastcollate.core.collator", "fastcollate.loader.dataloader", "fastcollate.cli"} <= eager
    assert "fastcollate.ray" not in eager and not any(m.startswith("fastcollate._bench") for m in eager)
    assert "numpy" in set().union(*(imports_of(m)[1] for m in eager))  # the check below is not vacuous


def test_every_module_level_import_of_an_eager_module_is_a_dependency():
    deps = declared(pyproject()["dependencies"])
    missing = {}
    for name in sorted(eager_modules()):
        for top in sorted(imports_of(name)[1]):
            if not distribution_of(top) & deps:
                missing.setdefault(top, []).append(name)
    assert not missing, (f"imported when `import fastcollate` (or the CLI) runs, but not in [project] dependencies "
                         f"of pyproject.toml: {missing}")


def test_every_module_level_import_of_an_optional_adapter_is_declared_somewhere():
    project = pyproject()
    everything = declared(project["dependencies"]).union(*(declared(r) for r in project["optional-dependencies"].values()))
    eager = eager_modules()
    missing = {}
    for name in sorted(set(MODULES) - eager):
        for top in sorted(imports_of(name)[1]):
            if not distribution_of(top) & everything:
                missing.setdefault(top, []).append(name)
    assert not missing, f"imported by optional modules but in no dependency or extra of pyproject.toml: {missing}"



# What each Sphinx extension of docs/conf.py needs installed, by distribution. sphinx-gallery runs
# its default reset_modules (matplotlib's) around every example, and so imports matplotlib,
# although its own requirements do not name it.
EXTENSION_NEEDS = {
    "myst_parser": {"myst-parser"},
    "sphinx.ext.": {"sphinx"},  # Sphinx's own
    "sphinx_gallery.gen_gallery": {"sphinx-gallery", "matplotlib"},
}


def docs_conf_needs() -> dict[str, set[str]]:
    """What docs/conf.py names -- its extensions and its HTML theme -- mapped to distributions."""
    tree = ast.parse((ROOT / "docs" / "conf.py").read_text())
    values = {t.id: node.value for node in tree.body if isinstance(node, ast.Assign)
              for t in node.targets if isinstance(t, ast.Name)}
    needs = {}
    for ext in ast.literal_eval(values["extensions"]):
        key = next((k for k in EXTENSION_NEEDS if ext == k or (k.endswith(".") and ext.startswith(k))), None)
        assert key, f"docs/conf.py uses the extension {ext!r}: add what it needs to EXTENSION_NEEDS here"
        needs[ext] = EXTENSION_NEEDS[key]
    theme = ast.literal_eval(values["html_theme"])
    needs[f"html_theme {theme}"] = {dist_name(theme)}
    return needs


def test_the_docs_extra_covers_what_the_docs_build_needs():
    project = pyproject()
    have = declared(project["dependencies"]) | declared(project["optional-dependencies"]["docs"]) | {"fastcollate"}
    needs = docs_conf_needs()
    for example in sorted((ROOT / "docs" / "examples").glob("*.py")):  # sphinx-gallery executes them
        tree = ast.parse(example.read_text())
        needs[f"examples/{example.name}"] = {d for node in eager_statements(tree.body) for top in (
            [a.name.split(".")[0] for a in node.names] if isinstance(node, ast.Import) else [node.module.split(".")[0]])
            if top not in sys.stdlib_module_names for d in distribution_of(top)}
    missing = {what: sorted(dists - have) for what, dists in needs.items() if dists - have}
    assert not missing, f"`pip install -e \".[docs]\"` lacks what the docs build needs: {missing}"
    assert "sphinx_gallery.gen_gallery" in needs  # the map above is used, not bypassed
