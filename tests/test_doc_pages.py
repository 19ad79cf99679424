"""docs/getting_started.md and docs/troubleshooting.md are true to the code: their ```python blocks
run, and what they say about errors -- which exception, which message, what the CLI prints -- is
what happens.

The blocks of a page run in order in one fresh interpreter (as a reader pastes them), with
warnings as errors. A block that needs what only a reader has (their dataset, a checkpoint, an
optional package) is marked on the line right above its fence:

    <!-- docs-test: skip (why) -->

and is left out; the comment does not show on the rendered page.

The statements about errors are read from the pages (the exception class a sentence names) and
checked against the code, so changing either alone fails here.
"""
from __future__ import annotations

import builtins
import os
import re
import subprocess
import sys

import pytest

import fastcollate
from package_copy import OLDER, copy_package

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ("getting_started.md", "troubleshooting.md")
SKIP = re.compile(r"^<!--\s*docs-test:\s*skip\b.*-->\s*$")


def read(page: str) -> str:
    with open(os.path.join(ROOT, "docs", page)) as f:
        return f.read()


def python_blocks(text: str) -> list[tuple[int, str, bool]]:
    """(line number, code, skipped) of every ```python block."""
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        if re.match(r"^```python\s*$", lines[i]):
            skipped = i > 0 and bool(SKIP.match(lines[i - 1]))
            start, body = i + 1, []
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            out.append((start + 1, "\n".join(body) + "\n", skipped))
        i += 1
    return out


def one_sentence(text: str, pattern: str) -> re.Match:
    """The statement ``pattern`` matches in a page (line breaks read as spaces); exactly one."""
    flat = re.sub(r"\s+", " ", text)
    found = list(re.finditer(pattern, flat))
    assert len(found) == 1, f"expected one statement matching {pattern!r}, found {len(found)}"
    return found[0]


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("FASTCOLLATE_DISABLE", "FASTCOLLATE_ALLOW_FALLBACK")}
    env.update(CUDA_VISIBLE_DEVICES="", **extra)
    return env


def test_the_skip_marker_is_read():
    text = "<!-- docs-test: skip (needs ds) -->\n```python\nds\n```\n\n```python\nx = 1\n```\n"
    assert [(skipped, code) for _, code, skipped in python_blocks(text)] == [(True, "ds\n"), (False, "x = 1\n")]


@pytest.mark.parametrize("page", PAGES)
def test_the_python_blocks_of_the_page_run(page, tmp_path):
    blocks = python_blocks(read(page))
    run = [code for _, code, skipped in blocks if not skipped]
    assert run, f"docs/{page} has no runnable ```python block"
    script = "".join(f"print('== block {n}', flush=True)\n{code}" for n, code in enumerate(run))
    r = subprocess.run([sys.executable, "-W", "error::UserWarning", "-W", "error::RuntimeWarning", "-c", script],
                       cwd=tmp_path, env=clean_env(PYTHONPATH=ROOT), capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, f"docs/{page}: a block failed\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"


# ---- troubleshooting.md ---------------------------------------------------------------------------

def test_state_dict_raises_what_troubleshooting_says():
    said = one_sentence(read("troubleshooting.md"), r"calling it raises an? `(\w+)` that says what to use instead")
    loader = fastcollate.DataLoader(range(8), batch_size=4)
    with pytest.raises(Exception) as info:
        loader.state_dict()
    assert type(info.value).__name__ == said.group(1)
    assert "fastcollate.StatefulDataLoader" in str(info.value) and "torchdata" in str(info.value)
    assert not hasattr(loader, "state_dict") and not hasattr(loader, "load_state_dict")  # as torch's loader
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        loader.nothing_here  # noqa: B018 (any other missing name: the usual error)


# ---- getting_started.md: a build that does not serve -----------------------------------------------

def _import_in(root, tmp_path, **env):
    code = ("import warnings\nwarnings.simplefilter('always')\n"
            "import fastcollate\nprint(fastcollate.backend())\n")
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=clean_env(PYTHONPATH=str(root), **env),
                          capture_output=True, text=True, timeout=120)


def _doctor_in(root, tmp_path):
    return subprocess.run([sys.executable, "-m", "fastcollate", "doctor"], cwd=tmp_path,
                          env=clean_env(PYTHONPATH=str(root)), capture_output=True, text=True, timeout=300)


def test_a_build_for_another_torch_is_what_getting_started_says(tmp_path):
    text = read("getting_started.md")
    raised = one_sentence(text, r"\*\*Built for another torch\*\*.*?`import fastcollate` raises an? `(\w+)`")
    exit_status = one_sentence(text, r"`fastcollate doctor` prints that same message as its one error line and "
                                     r"exits with status (\d+)")
    root = copy_package(tmp_path, record=OLDER)
    r = _import_in(root, tmp_path)
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode != 0 and last.startswith(f"{raised.group(1)}: fastcollate: the compiled engine was built for "
                                                 "torch 2.12.0"), r.stderr[-2000:]
    message = last.split(": ", 1)[1]
    assert "but this is torch" in message and "pip install --no-build-isolation" in message  # both builds, the fix
    r = _doctor_in(root, tmp_path)
    assert r.returncode == int(exit_status.group(1)) and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.strip().splitlines() == [f"fastcollate: error: {message.removeprefix('fastcollate: ')}"]
    # ... and FASTCOLLATE_ALLOW_FALLBACK=1 turns it into a warning and the pure-Python path
    assert "With `FASTCOLLATE_ALLOW_FALLBACK=1` the import warns instead" in re.sub(r"\s+", " ", text)
    r = _import_in(root, tmp_path, FASTCOLLATE_ALLOW_FALLBACK="1")
    assert r.returncode == 0 and r.stdout.strip() == "python" and "RuntimeWarning" in r.stderr, r.stderr[-2000:]


def test_a_module_that_does_not_load_is_what_getting_started_says(tmp_path):
    text = read("getting_started.md")
    warned = one_sentence(text, r"\*\*Not built, or not loadable\*\*.*?warns once \(an? `(\w+)`")
    root = copy_package(tmp_path, garbage_module=True)
    r = _import_in(root, tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "python", r.stderr[-2000:]
    ours = [line for line in r.stderr.splitlines() if "fastcollate: the compiled engine could not be loaded" in line]
    assert len(ours) == 1 and f"{warned.group(1)}:" in ours[0] and "pip install --no-build-isolation" in ours[0]
    assert issubclass(getattr(builtins, warned.group(1)), Warning)
    shows = one_sentence(text, r"`fastcollate doctor` runs and shows `compiled backend python \(\.\.\.\)`")
    assert shows
    r = _doctor_in(root, tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    line = next(line for line in r.stdout.splitlines() if line.strip().startswith("compiled backend"))
    assert re.match(r"^\s*compiled backend\s+python \(.+\)$", line), line
