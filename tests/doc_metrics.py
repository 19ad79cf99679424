"""How long the prose of README.md and docs/**/*.md runs: words per sentence (median, 90th
percentile) and words of prose per page. ``python tests/doc_metrics.py`` prints the figures and
the longest pages and sentences; tests/test_docs.py holds them to the bars.

Prose only: fenced code blocks, tables, headings, HTML comments, MyST directive options and link
targets are left out. A sentence ends at ``.``, ``!`` or ``?`` followed by a space or the end of
a paragraph (so ``torch.utils.data`` or ``1.5x`` do not end one), and a paragraph or list item
ends one too. A word is what whitespace separates, once inline code and link targets are reduced
to their text."""
from __future__ import annotations

import glob
import os
import re
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GENERATED = ("docs/changelog.md",)  # the changelog is a record, not a page to read through

_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+")


def pages() -> list[str]:
    found = ["README.md"] + sorted(glob.glob("docs/**/*.md", root_dir=ROOT, recursive=True))
    return [p for p in found if p not in GENERATED and not p.startswith(("docs/auto_examples/", "docs/_"))]


def paragraphs(text: str) -> list[str]:
    """The prose blocks of a Markdown page, each joined into one line."""
    out: list[str] = []
    cur: list[str] = []
    fence = None
    comment = False

    def flush() -> None:
        if cur:
            out.append(" ".join(cur))
            cur.clear()

    for raw in text.splitlines():
        line = raw.strip()
        if fence is not None:
            if line.startswith(fence):
                fence = None
            continue
        m = re.match(r"(`{3,}|~{3,})", line)
        if m:
            flush()
            fence = m.group(1)
            continue
        if comment:
            comment = "-->" not in line
            continue
        if line.startswith("<!--"):
            flush()
            comment = "-->" not in line
            continue
        if not line or line.startswith(("#", "|", ":", "[")) and (line.startswith(("#", "|"))
                                                                    or re.match(r"^:\w+:|^\[[^\]]+\]:", line)):
            flush()
            continue
        if re.match(r"^([-*+]|\d+\.)\s", line):  # a list item starts a new block
            flush()
            line = re.sub(r"^([-*+]|\d+\.)\s+", "", line)
        cur.append(line.lstrip("> "))
    flush()
    return out


def plain(par: str) -> str:
    par = re.sub(r"!\[[^\]]*\]\([^)]*\)", "", par)          # images
    par = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", par)       # links: their text
    par = re.sub(r"\{\w+\}`([^`]*)`", r"\1", par)            # MyST roles
    return par.replace("**", "").replace("`", "")


def sentences(par: str) -> list[list[str]]:
    out = []
    for s in _END.split(plain(par)):
        words = [w for w in s.split() if re.search(r"\w", w)]
        if words:
            out.append(words)
    return out


def measure(paths: list[str] | None = None) -> dict:
    lengths: list[int] = []
    per_page: dict[str, int] = {}
    longest: list[tuple[int, str, str]] = []
    for p in paths or pages():
        with open(os.path.join(ROOT, p)) as f:
            text = f.read()
        words = 0
        for par in paragraphs(text):
            for s in sentences(par):
                lengths.append(len(s))
                words += len(s)
                longest.append((len(s), p, " ".join(s)))
        per_page[p] = words
    lengths.sort()
    p90 = lengths[min(len(lengths) - 1, int(0.9 * len(lengths)))] if lengths else 0
    return {"sentences": len(lengths), "median": statistics.median(lengths) if lengths else 0, "p90": p90,
            "pages": per_page, "longest": sorted(longest, reverse=True)[:20]}


def main() -> None:
    m = measure(sys.argv[1:] or None)
    print(f"{m['sentences']} sentences: median {m['median']} words, 90th percentile {m['p90']}")
    for p, w in sorted(m["pages"].items(), key=lambda t: -t[1])[:10]:
        print(f"  {w:6d} words of prose  {p}")
    for n, p, s in m["longest"][:5]:
        print(f"  {n} words ({p}): {s[:160]}")


if __name__ == "__main__":
    main()
