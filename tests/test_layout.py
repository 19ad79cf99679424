"""The package laid out by pipeline stage: the old flat module paths still work for a release,
with a DeprecationWarning; pickles made before the move load; importing fastcollate loads no
benchmark code; the layers depend one way."""
from __future__ import annotations

import ast
import importlib
import os
import pickle
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

import fastcollate
from fastcollate import _compat
from helpers import assert_same

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "fastcollate")


def _public_names(module_name: str) -> list[str]:
    mod = importlib.import_module(module_name)
    return [n for n in vars(mod) if not n.startswith("__")]


@pytest.mark.parametrize("old", sorted(_compat.MOVED))
def test_every_old_path_imports_and_warns(old):
    new, renamed = _compat.MOVED[old]
    module = importlib.import_module(f"fastcollate.{old}")
    target = importlib.import_module(f"fastcollate.{new}")
    names = [n for n in _public_names(f"fastcollate.{new}") if not n.startswith("_")][:3] or ["__name__"]
    for name in names + list(renamed):
        with pytest.warns(DeprecationWarning, match=f"fastcollate.{old}.{name} moved to fastcollate.{new}"):
            value = getattr(module, name)
        assert value is getattr(target, renamed.get(name, name))
    with pytest.warns(DeprecationWarning):
        exec(f"from fastcollate.{old} import {names[0]}", {})


def test_old_paths_never_rebind_the_package_attributes():
    import fastcollate.collate  # noqa: F401 - the old module path
    assert callable(fastcollate.collate) and fastcollate.collate.__name__ == "collate"
    assert fastcollate.reference is importlib.import_module("fastcollate.core.reference")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # stable paths do not warn
        from fastcollate.reference import collate  # noqa: F401
        from fastcollate.transforms import Normalize  # noqa: F401
        from fastcollate import ArrayDataset, Collator, DataLoader, StallMonitor  # noqa: F401
        from fastcollate.loader import DataLoader as OldPath  # the old module is the loader stage's package now
        assert OldPath is fastcollate.DataLoader
    # the shared torch suite's swap reads the kill switch's original through the old path
    with pytest.warns(DeprecationWarning):
        assert sys.modules["fastcollate.collate"].default_collate is torch.utils.data._utils.collate.default_collate


def test_pickles_made_before_the_move_load():
    path = os.path.join(os.path.dirname(__file__), "data", "pre_layout_0.1.pkl")  # written by fastcollate 0.1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with open(path, "rb") as f:
            objs = pickle.load(f)
    ds = objs["array_dataset"]
    idx = [5, 1, 4]  # rows of equal length in the ragged column
    assert_same(fastcollate.collate(ds.__getitems__(idx)), default_collate([ds[i] for i in idx]))
    assert ds.ungathered() == {} and ds.layout.n == 6
    tw = objs["token_windows"]
    assert_same(fastcollate.collate(tw.__getitems__([1, 0])), default_collate([tw[1], tw[0]]))
    c = objs["collator"]
    batch = [{"ids": [1, 2, 3]}, {"ids": [4]}]
    assert_same(c(batch), fastcollate.Collator(pad={"ids": 0}, pad_to_multiple_of=4, lengths_key="lengths",
                                               backend="python")(batch))
    assert len(list(objs["sampler"])) == 4
    # and today's pickles name today's paths
    assert b"fastcollate.data.arrays" in pickle.dumps(ds) and b"fastcollate.arrays" not in pickle.dumps(ds)


def test_import_loads_no_benchmark_code():
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", "import fastcollate"], capture_output=True,
                         text=True, check=True, cwd=ROOT)
    loaded = [line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if "fastcollate" in line]
    assert "fastcollate.core.collator" in loaded
    assert not [m for m in loaded if "_bench" in m or m.startswith(("fastcollate.bench", "fastcollate.workloads"))]


# which layer may import which (the README's layout): core <- data, cache, images, loader, device;
# tuning (what the doctor, tune and the auto mode share) <- loader, training, doctor; nothing below
# imports _bench; the CLI is the only door to it; fastcollate.ray (the Ray adapter, the one module
# that imports ray) is imported by the benchmarks only
ALLOWED = {
    "core": {"core"},
    "data": {"core", "data"},
    "cache": {"core", "cache"},
    "images": {"core", "images"},
    # the auto mode (num_workers="auto") plans with the model and this rank's share of the node
    "loader": {"core", "loader", "tuning"},
    "device": {"core", "device"},
    # the StallMonitor reads the doctor's diagnosis (a trace -> the stage the loop waits for): the
    # one module of the doctor that the loop imports (test_the_loop_reads_only_the_diagnosis)
    "training": {"core", "device", "training", "tuning", "doctor"},
    # the doctor and tune apply what they propose: they build fastcollate.DataLoader (loader) and
    # Cached (cache), and trace your loop with the StallMonitor (training)
    "doctor": {"core", "data", "cache", "loader", "device", "training", "tuning", "doctor"},
    # this rank's share of the node, the machine's load (the cache's reading of it), the model and
    # measuring
    "tuning": {"core", "cache", "tuning"},
    "_bench": {"core", "data", "loader", "device", "training", "tuning", "_bench", "ray"},
}


def _imports(path: str) -> set[str]:
    tree = ast.parse(open(path).read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level >= 1:
            # relative to the file's package: level 1 is its own package, 2 the root
            layer = os.path.relpath(os.path.dirname(path), PKG).split(os.sep)[0]
            base = node.module or ""
            if node.level == 1:
                found.add(layer)
            elif node.level == 2 and base:
                found.add(base.split(".")[0])
            elif node.level == 2:  # from .. import _ext, transforms...
                found.update(a.name for a in node.names)
    return found


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_layers_depend_one_way(layer):
    root_modules = {"_ext", "_text", "_compat"}
    for name in os.listdir(os.path.join(PKG, layer)):
        if name.endswith(".py"):
            bad = _imports(os.path.join(PKG, layer, name)) - ALLOWED[layer] - root_modules
            assert not bad, f"fastcollate/{layer}/{name} imports {sorted(bad)}"


def test_the_loop_reads_only_the_diagnosis():
    # training -> doctor is one module wide: the doctor runs the loop's monitor, not the reverse
    for name in os.listdir(os.path.join(PKG, "training")):
        if name.endswith(".py"):
            tree = ast.parse(open(os.path.join(PKG, "training", name)).read())
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.level == 2 and node.module == "doctor":
                    assert [a.name for a in node.names] == ["diagnosis"], f"training/{name}"
                elif isinstance(node, ast.ImportFrom) and node.level == 2 and (node.module or "").startswith("doctor."):
                    assert node.module == "doctor.diagnosis", f"training/{name} imports {node.module}"


def test_no_private_name_crosses_a_module():
    # within a module its own _names are its business; importing another module's is a leak
    offenders = []
    for dirpath, _, files in os.walk(PKG):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(dirpath, name)
            for node in ast.walk(ast.parse(open(path).read())):
                if isinstance(node, ast.ImportFrom) and node.level >= 1 and node.module not in (None, "_ext"):
                    offenders += [f"{os.path.relpath(path, ROOT)}: {a.name}" for a in node.names
                                  if a.name.startswith("_") and a.name != "__version__"]
    assert offenders == []


def test_every_package_folder_is_shipped():
    # pyproject names the packages one by one; a new folder left out installs in an editable
    # checkout and is missing from the sdist and the wheel (CI's wheel build found fastcollate.tuning)
    import tomllib
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        listed = set(tomllib.load(f)["tool"]["setuptools"]["packages"])
    found = {os.path.relpath(d, ROOT).replace(os.sep, ".")
             for d, _, files in os.walk(PKG) if "__init__.py" in files and "__pycache__" not in d}
    assert found == listed, f"pyproject.toml's packages differ from the folders: missing {sorted(found - listed)}, stale {sorted(listed - found)}"


def test_no_import_circles_and_no_name_used_twice():
    import package_graph as pg

    assert pg.circles(pg.edges()) == [], "modules that import each other: decide which side owns the shared piece"
    assert pg.twice_named() == {}, "one file name, two mechanisms: name each for its own"


def test_the_package_graph_page_is_what_the_code_gives():
    import package_graph as pg

    with open(pg.PAGE) as f:
        assert f.read() == pg.page(), "docs/design/packages.md is stale: run python tests/package_graph.py"
