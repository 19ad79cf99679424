"""Every ```python block of README.md runs as written, on the CPU: each alone, and the whole tour
top to bottom in one interpreter, as a reader pastes it into one session (a block that rebinds a
name a later block uses -- ``ds`` -- breaks the second run, not the first).

Each run is a fresh interpreter (a subprocess: tracing and loaders wrap torch's classes
process-wide, and must not leak into other tests), in a scratch directory, with only the
stand-ins a reader brings -- their dataset ``ds``, a ``train_step``, a TensorBoard ``writer``,
a ``train.bin`` token file, a ``photos/`` image folder -- defined here, never in the README. A block that raises fails.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")

# What the README says it assumes ("ds stands for your map-style dataset of {"image": uint8
# tensor, "label": int} samples") and the few other things a reader has at hand.
STAND_INS = textwrap.dedent('''
    import numpy as np
    import torch


    class ImageDataset(torch.utils.data.Dataset):
        """{"image": uint8 3x32x32, "label": int} samples, made on access."""

        def __len__(self):
            return 96

        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            return {"image": torch.randint(0, 256, (3, 32, 32), dtype=torch.uint8, generator=g), "label": i % 10}


    class Writer:
        """What the README's TensorBoard line needs of a SummaryWriter."""

        def __init__(self):
            self.scalars = []

        def add_scalar(self, tag, value, step=None, *args, **kwargs):
            self.scalars.append((tag, float(value), step))


    def train_step(batch):
        return batch["image"].float().mean()


    ds = ImageDataset()
    writer = Writer()
    np.arange(64 * 1024, dtype=np.uint16).tofile("train.bin")  # the memmap the storage block opens

    import os
    from PIL import Image

    for c in ("cat", "dog"):  # the image folder the images block reads: photos/<class>/<file>.jpg
        os.makedirs(os.path.join("photos", c), exist_ok=True)
        for k in range(24):
            pixels = np.random.default_rng(k).integers(0, 256, (90, 120, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(os.path.join("photos", c, f"{k}.jpg"))
''')

# the blocks named on the command line, in order, in ONE namespace (what a reader's session is)
RUNNER = textwrap.dedent('''
    import sys
    import stand_ins
    session = {"__name__": "__main__", **{k: getattr(stand_ins, k) for k in ("ds", "writer", "train_step")}}
    for path in sys.argv[1:]:
        print(f"== {path}", file=sys.stderr, flush=True)
        with open(path) as f:
            exec(compile(f.read(), path, "exec"), session)
''')


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(line number, code) of every ```python block."""
    blocks, lines = [], text.splitlines()
    i = 0
    while i < len(lines):
        if re.match(r"^```python\s*$", lines[i]):
            start, body = i + 1, []
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            blocks.append((start + 1, "\n".join(body) + "\n"))
        i += 1
    return blocks


with open(README) as f:
    BLOCKS = python_blocks(f.read())


def test_readme_is_short_and_has_a_tour():
    with open(README) as f:
        n = len(f.read().splitlines())
    assert n <= 300, f"README.md has {n} lines: the design notes and measurement history belong in docs/"
    assert 5 <= len(BLOCKS) <= 8, f"{len(BLOCKS)} python blocks: the tour has 5-8 snippets"


def run_blocks(blocks: list[tuple[int, str]], tmp_path, timeout: int) -> subprocess.CompletedProcess:
    """Run ``blocks`` in order in one fresh interpreter; each is a file named after its README line."""
    (tmp_path / "stand_ins.py").write_text(STAND_INS)
    (tmp_path / "run_blocks.py").write_text(RUNNER)
    names = []
    for line, code in blocks:
        names.append(f"README.md-line{line}.py")
        (tmp_path / names[-1]).write_text(code)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, str(tmp_path)]), CUDA_VISIBLE_DEVICES="")
    env.pop("FASTCOLLATE_DISABLE", None)
    # the stand-ins module writes train.bin into the working directory when first imported
    # warnings are errors: a snippet that makes the library warn (pin_memory=True beside the
    # prefetcher, say) contradicts the advice around it
    return subprocess.run([sys.executable, "-W", "error::UserWarning", "-W", "error::RuntimeWarning", "run_blocks.py",
                           *names], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("line,code", BLOCKS, ids=[f"line{line}" for line, _ in BLOCKS])
def test_readme_block_runs(line, code, tmp_path):
    r = run_blocks([(line, code)], tmp_path, timeout=180)
    assert r.returncode == 0, f"README.md block at line {line} failed:\n{code}\n--- stderr:\n{r.stderr[-4000:]}"


def test_the_tour_runs_top_to_bottom_in_one_interpreter(tmp_path):
    # no block may rebind a name (ds, loader...) that a later block takes as the reader's own
    r = run_blocks(BLOCKS, tmp_path, timeout=300)
    started = [l for l in r.stderr.splitlines() if l.startswith("== README.md-line")]
    assert r.returncode == 0, (f"the tour failed in one session, in {started[-1][3:] if started else '?'}:\n"
                               f"--- stderr:\n{r.stderr[-4000:]}")
    assert len(started) == len(BLOCKS)
