"""The image-folder workload's JPEGs live in a temporary folder exactly as long as a dataset reads
them: shared while a dataset holds them, left alone by workers, removed when the last dataset is
collected and when the process ends (normally or by Ctrl-C) -- `doctor --dataset
fastcollate._bench.image_bench:dataset` leaves nothing in the temporary directory."""
from __future__ import annotations

import gc
import os
import pickle
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_image_folder_files_live_as_long_as_a_dataset():
    pytest.importorskip("PIL")
    from fastcollate._bench import image_bench as images

    ds = images.dataset(n=6, size=48)
    path = ds.folder.path
    again = images.dataset(n=6, size=48, crop=32)
    assert again.folder is ds.folder and len(os.listdir(path)) > 0  # one folder, shared
    copy = pickle.loads(pickle.dumps(ds))  # what a spawn worker gets: the paths, not the files' ownership
    assert copy.folder is None and copy.items == ds.items
    del copy
    gc.collect()
    assert os.path.isdir(path)
    del ds
    gc.collect()
    assert os.path.isdir(path) and again[0][0].shape == (3, 32, 32)
    del again
    gc.collect()
    assert not os.path.exists(path)
    with images.Folder(n=2, size=48) as folder:
        assert os.path.isdir(folder.path)
    assert folder.removed and not os.path.exists(folder.path)


SCRIPT = textwrap.dedent('''
    import importlib, os, sys
    import torch
    # as `fastcollate doctor --dataset fastcollate._bench.image_bench:dataset` loads it: module:attr, a factory
    mod, attr = "fastcollate._bench.image_bench:dataset".split(":")
    ds = getattr(importlib.import_module(mod), attr)()
    path = ds.folder.path
    print(path, flush=True)
    # fork workers hold a copy of the dataset and exit: the files stay for the rest of the run
    for ctx in ("fork", "spawn"):
        loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context=ctx,
                                             sampler=range(16))
        assert sum(len(b[1]) for b in loader) == 16
        del loader
    assert len(ds) == 256 and os.path.isdir(path) and ds[255][0].shape == (3, 224, 224)
    if sys.argv[1] == "interrupt":
        raise KeyboardInterrupt
''')


@pytest.mark.parametrize("how", ["exit", "interrupt"])
def test_image_folder_is_removed_when_the_process_ends(tmp_path, how):
    pytest.importorskip("PIL")
    env = dict(os.environ, TMPDIR=str(tmp_path), PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", SCRIPT, how], capture_output=True, text=True, env=env, timeout=300)
    if how == "exit":
        assert r.returncode == 0, r.stderr
    else:  # Python ends an uncaught Ctrl-C by SIGINT, after its exit handlers
        assert r.returncode != 0 and "KeyboardInterrupt" in r.stderr, r.stderr
    path = r.stdout.split()[0]
    assert path.startswith(str(tmp_path)) and not os.path.exists(path)
    assert [p for p in os.listdir(tmp_path) if p.startswith("fastcollate-images-")] == []
