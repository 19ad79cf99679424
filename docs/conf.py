"""Sphinx configuration of the fastcollate documentation.

Build (CI does, with warnings as errors and the gallery's examples executed):

    pip install --no-build-isolation -e ".[docs]"
    python -m sphinx -W --keep-going -b html docs docs/_build/html

Pages are Markdown (MyST); the API reference is generated from the docstrings (autosummary +
napoleon) of everything in ``fastcollate.__all__``; docs/examples/*.py run at every build
(sphinx-gallery) on the CPU.
"""
from __future__ import annotations

import importlib.util
import os
import re
import sys

DOCS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(DOCS)
sys.path.insert(0, ROOT)  # the checkout's package (built in place by `pip install -e`)
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # the examples are CPU examples, wherever the docs are built

import fastcollate  # noqa: E402

project = "fastcollate"
author = "the fastcollate authors"
copyright = "the fastcollate authors"
release = version = fastcollate.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx_gallery.gen_gallery",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
templates_path = ["_templates"]
exclude_patterns = ["_build", "auto_examples/*.ipynb", "auto_examples/*.py", "auto_examples/*.zip",
                    "auto_examples/*.md5", "auto_examples/*.codeobj.json", "examples/README.txt"]

# -- Markdown
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# -- API reference
autosummary_generate = True
autosummary_imported_members = True
autodoc_default_options = {"members": True, "undoc-members": False}
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# fastcollate.ray subclasses Ray Data's collate classes: documented without ray where it is absent
autodoc_mock_imports = [] if importlib.util.find_spec("ray") else ["ray"]

# -- Examples, executed at every build
sphinx_gallery_conf = {
    "examples_dirs": ["examples"],
    "gallery_dirs": ["auto_examples"],
    "filename_pattern": r".*\.py$",          # every example runs, not only plot_*.py
    "abort_on_example_error": True,
    "download_all_examples": False,
    "remove_config_comments": True,
    "within_subsection_order": "FileNameSortKey",
    "show_memory": False,
    "image_scrapers": (),                    # the examples print; they draw nothing
    "min_reported_time": 10**9,              # no per-example timing line: it would change on every build
    "write_computation_times": False,        # nor a timings page
}

# -- HTML
html_theme = "furo"
html_title = f"fastcollate {release}"
html_static_path: list[str] = []
html_show_sourcelink = False


# -- Checks and guards
def _api_names() -> set[str]:
    """The names the API page lists in its blocks under ``.. currentmodule:: fastcollate``."""
    with open(os.path.join(DOCS, "api", "index.md")) as f:
        text = f.read()
    names: set[str] = set()
    for block in text.split("```{eval-rst}")[1:]:
        block = block.split("```", 1)[0]
        if re.search(r"^\.\. currentmodule:: fastcollate\s*$", block, flags=re.M):
            names |= set(re.findall(r"^ {3}([A-Za-z_]\w*)\s*$", block, flags=re.M))
    return names


def _check_api_page(app) -> None:
    missing = sorted(set(fastcollate.__all__) - _api_names())
    if missing:
        raise RuntimeError(f"docs/api/index.md does not list {missing} from fastcollate.__all__")


def _optional_pages(app, docname: str, source: list[str]) -> None:
    """A toctree entry may name a page another change adds (``docs/stable_abi.md``): while that
    file is absent the entry is dropped, so the build does not fail on it."""
    if docname != "design/index":
        return
    lines = []
    for line in source[0].splitlines():
        m = re.match(r"^\s*/?(stable_abi)\s*$", line)
        if m and not os.path.exists(os.path.join(DOCS, m.group(1) + ".md")):
            continue
        lines.append(line)
    source[0] = "\n".join(lines) + "\n"


def setup(app):
    app.connect("builder-inited", _check_api_page)
    app.connect("source-read", _optional_pages)
