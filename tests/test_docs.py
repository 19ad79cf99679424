"""The documentation stays true without building it (CI builds it too, with warnings as errors):
the API page lists everything in ``fastcollate.__all__``, the README's Layout section and the
docs' file map name every source file, and the README's links to the docs lead to pages."""
from __future__ import annotations

import os
import re

import pytest

import fastcollate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
MAPPED = ("csrc", "fastcollate", "examples", "benchmarks")  # the trees whose every file the maps name
SOURCE = (".py", ".cpp", ".h", ".cu", ".cuh", ".md")


def read(*parts: str) -> str:
    with open(os.path.join(ROOT, *parts)) as f:
        return f.read()


def source_files() -> list[str]:
    out = []
    for top in MAPPED:
        for dirpath, dirnames, files in os.walk(os.path.join(ROOT, top)):
            dirnames[:] = [d for d in dirnames if d != "__pycache__" and not d.startswith(".")]
            out += [os.path.relpath(os.path.join(dirpath, f), ROOT) for f in files if f.endswith(SOURCE)]
    return sorted(out)


def stem(path: str) -> str:
    name = os.path.basename(path)
    return name if name.endswith(".md") else name.rsplit(".", 1)[0]


def named(stem_: str, text: str) -> bool:
    return re.search(rf"(?<![\w.]){re.escape(stem_)}(?![\w])", text) is not None


def test_api_page_lists_all_of_fastcollate_all():
    text = read("docs", "api", "index.md")
    names: set[str] = set()
    for block in text.split("```{eval-rst}")[1:]:
        block = block.split("```", 1)[0]
        if re.search(r"^\.\. currentmodule:: fastcollate\s*$", block, flags=re.M):
            names |= set(re.findall(r"^ {3}([A-Za-z_]\w*)\s*$", block, flags=re.M))
    assert set(fastcollate.__all__) - names == set()


def readme_layout() -> str:
    text = read("README.md")
    section = text.split("\n## Layout", 1)[1].split("\n## ", 1)[0]
    return section


@pytest.mark.parametrize("where", ["README.md Layout", "docs/design/layout.md"])
def test_every_source_file_is_on_the_map(where):
    text = readme_layout() if where.startswith("README") else read("docs", "design", "layout.md")
    missing = [p for p in source_files() if not named(stem(p), text)]
    assert missing == [], f"{where} does not name {missing}: add them (one line each in the docs' map)"


def test_readme_links_to_docs_pages_that_exist():
    links = re.findall(r"\]\((docs/[^)#]+)", read("README.md"))
    assert links, "the README links to the docs"
    assert [p for p in links if not os.path.exists(os.path.join(ROOT, p))] == []


def test_docs_pages_are_in_the_repository():
    # the pages the index's toctrees name exist (the build checks the rest)
    index = read("docs", "index.md")
    entries = re.findall(r"^([a-z_/]+)$", index, flags=re.M)
    missing = [e for e in entries if e != "auto_examples/index" and not os.path.exists(os.path.join(DOCS, e + ".md"))]
    assert entries and missing == []


def test_the_prose_is_short():
    # issue #44's bars, over README.md and docs/**/*.md (the changelog aside): prose sentences of
    # median <= 16 words and 90th percentile <= 32; no page over 2,500 words of prose
    import doc_metrics

    m = doc_metrics.measure()
    assert m["median"] <= 16 and m["p90"] <= 32, (m["median"], m["p90"], m["longest"][:3])
    long_pages = {p: w for p, w in m["pages"].items() if w > 2500}
    assert long_pages == {}, long_pages


@pytest.mark.parametrize("phrase", ["what changed since", "since the last run", "than the last run", "the previous run"])
def test_no_page_narrates_earlier_runs(phrase):
    import doc_metrics

    hits = [p for p in doc_metrics.pages() if phrase in read(p).lower()]
    assert hits == [], f"{hits} narrate earlier runs ({phrase!r}): that is the changelog's"
