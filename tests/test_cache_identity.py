"""The node cache's dataset fingerprint (fastcollate.cache.identity): different content of
one type and length never shares a digest; the same content gives the same digest in another
process (another hash seed); where the walk can only sample it says so."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import torch

from fastcollate.cache.identity import fingerprint, same_value, spot_check

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Folder:
    def __init__(self, files, seed=0, transform=None):
        self.files = files
        self.seed = seed
        self.transform = transform
        self.tags = {"a", "b", "c"}
        self.rng = np.random.default_rng(seed + 100)  # the random part: by type only
        self.me = self  # a cycle

    def __len__(self):
        return len(self.files)


def test_what_differs_is_named_and_what_is_the_same_agrees():
    files = [(f"/data/{i}.jpg", i % 3) for i in range(10)]
    base = fingerprint(Folder(files))
    assert base.complete and base.digest == fingerprint(Folder(list(files))).digest
    assert base.differing(fingerprint(Folder(files, seed=1))) == ["attribute seed"]
    assert base.differing(fingerprint(Folder(files[::-1]))) == ["attribute files"]
    assert base.differing(fingerprint(Folder(files, transform=abs))) == ["attribute transform"]
    long = [(f"/data/{i}.jpg", i % 3) for i in range(50_000)]  # the repr path of a long plain list
    other = list(long)
    other[31_337] = ("/data/x.jpg", 0)
    assert fingerprint(Folder(long)).differing(fingerprint(Folder(other))) == ["attribute files"]
    assert fingerprint([torch.zeros(3)]).digest != fingerprint([torch.zeros(3, dtype=torch.float64)]).digest
    assert fingerprint([torch.zeros(3)]).digest != fingerprint([torch.tensor([0.0, 0.0, -0.0])]).digest  # bytes


def test_another_process_with_another_hash_seed_agrees(tmp_path):
    for k in range(3):
        (tmp_path / f"f{k}.bin").write_bytes(b"x" * k)
    paths = repr(frozenset(str(tmp_path / f"f{k}.bin") for k in range(3)))
    code = ("import sys, logging; sys.path.insert(0, 'tests'); from test_cache_identity import Folder; "
            "from fastcollate.cache.identity import fingerprint; "
            "f = Folder([('/d/1', 0)], transform=frozenset({'x', 'y', 'z'})); "
            f"f.files_set = {paths}; f.by_key = {{k: len(k) for k in f.files_set}}; "
            "f.log = logging.getLogger('ds'); f.log.isEnabledFor(10); "
            "print(fingerprint(f).digest)")
    got = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True,
                          env=dict(os.environ, PYTHONHASHSEED=seed)).stdout for seed in ("1", "2", "3")}
    assert len(got) == 1, got


def test_files_rewritten_change_it(tmp_path):
    path = tmp_path / "shard.bin"
    path.write_bytes(b"x" * 10)
    before = fingerprint(Folder([str(path)]))
    path.write_bytes(b"y" * 11)
    assert before.differing(fingerprint(Folder([str(path)]))) == ["files"]
    arr = np.arange(1000, dtype=np.int32)
    arr.tofile(tmp_path / "a.bin")
    mm = np.memmap(tmp_path / "a.bin", dtype=np.int32, mode="r")
    first = fingerprint([mm])
    assert first.complete and first.digest == fingerprint([np.memmap(tmp_path / "a.bin", dtype=np.int32, mode="r")]).digest


def test_what_it_cannot_read_whole_it_says_and_a_key_replaces_it():
    big = fingerprint([torch.zeros(40 << 20, dtype=torch.uint8)])
    assert not big.complete and "hashed in 64 chunks" in big.sampled[0]
    opaque = fingerprint(Folder([object()]))
    assert not opaque.complete and "nothing to read inside it" in opaque.sampled[0]

    class HF:  # a 🤗 datasets.Dataset names its own content
        def __init__(self, fp):
            self._fingerprint, self._data = fp, object()

        def __len__(self):
            return 3
    HF.__module__ = "datasets.arrow_dataset"
    assert fingerprint(HF("abc")).complete and fingerprint(HF("abc")).digest != fingerprint(HF("abd")).digest
    keyed = fingerprint(Folder([1]), key="v1")
    assert keyed.key == "v1" and keyed.digest == fingerprint(Folder([2]), key="v1").digest


def test_the_spot_check_compares_bytes_then_values():
    from fastcollate.cache.codec import decode, encode

    samples = {i: {"x": torch.full((4,), i), "s": {"a", "b"}} for i in range(4)}
    stored = {}
    for i, s in samples.items():
        blob = encode(s)
        buf = np.zeros(blob.nbytes, np.uint8)
        blob.write(buf, 0)
        stored[i] = buf

    def cached(i):
        return stored[i], lambda: decode(memoryview(stored[i]), 0)

    assert spot_check([0, 2], cached, samples.__getitem__, encode) is None
    other = {**samples, 2: {"x": torch.full((4,), 9), "s": {"a", "b"}}}
    assert spot_check([0, 2, 3], cached, other.__getitem__, encode) == 2
    assert same_value(float("nan"), float("nan")) and not same_value(torch.zeros(2), torch.zeros(2, dtype=torch.int64))


def test_an_image_folder_fingerprints_alike_in_two_processes(tmp_path):
    import sys as _sys
    sys_path = os.path.dirname(os.path.abspath(__file__))
    _sys.path.insert(0, sys_path)
    from images_data import write_folder

    write_folder(str(tmp_path), n_per_class=2)
    code = ("import fastcollate.images as fi; from fastcollate.cache.identity import fingerprint; "
            f"ds = fi.ImageFolder({str(tmp_path)!r}, transform=fi.RandomResizedCrop(8)); ds.set_epoch(3); "
            "f = fingerprint(ds); print(f.digest, f.complete)")
    got = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
           for _ in range(2)}
    assert len(got) == 1 and got.pop().split()[1] == "True"


def test_functions_by_what_they_compute():
    def make(k):
        return lambda x: x + k
    assert fingerprint([make(1)]).digest == fingerprint([make(1)]).digest
    assert fingerprint([make(1)]).digest != fingerprint([make(2)]).digest  # the captured value counts
