"""fastcollate.images: the compiled JPEG stage against its Pillow + torch reference, bitwise --
decode, partial decode, boxes, samples, batches -- over JPEG variants and a differential fuzzer;
the same batches for any number of workers and either loader; bad files refused by name."""
from __future__ import annotations

import io
import os
import random

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import fastcollate
import fastcollate.images as fi
from fastcollate import _ext
from fastcollate.images import pil_reference as reference
from fastcollate.images.boxes import Box, Draws
from images_data import jpeg, photo, variants, write_folder

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

ENGINE = fi.available()
needs_engine = pytest.mark.skipif(not ENGINE, reason=str(fi.why_not()))
VARIANTS = variants()


def pillow(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def test_the_compiled_stage_is_the_one_tested_where_libjpeg_was_built():
    # CI builds with libjpeg (.ci/run sets this): there the engine must be the one decoding, not
    # the Pillow fallback
    if os.environ.get("FASTCOLLATE_EXPECT_JPEG"):
        assert ENGINE, fi.why_not()
        assert fi.decoding.inspect(fi.decoding.as_bytes(VARIANTS["baseline-420"]), "x", 1 << 40).engine


def test_without_the_compiled_stage_every_image_goes_through_pillow_and_says_why(folder, monkeypatch):
    # what a build without libjpeg loads: the engine, without its JPEG stage
    want = [fi.ImageFolder(folder, transform=fi.RandomResizedCrop(24, flip=0.5), seed=3)[i] for i in range(4)]

    class NoJpeg:
        def __init__(self, C):
            self._C = C

        def __getattr__(self, name):
            return False if name == "jpeg_available" else getattr(self._C, name)

    if _ext._C is not None:
        monkeypatch.setattr(_ext, "_C", NoJpeg(_ext._C))
    assert not fi.available() and ("libjpeg" in fi.why_not() or "did not load" in fi.why_not())
    ds = fi.ImageFolder(folder, transform=fi.RandomResizedCrop(24, flip=0.5), seed=3)
    for i, (x, y) in enumerate(want):  # the same pixels, by Pillow
        got = ds[i]
        assert torch.equal(got[0], x) and got[1] == y
    assert ds.stats()["fallbacks"] == 4
    rgb = torch.from_numpy(pillow(VARIANTS["baseline-420"]).copy()).permute(2, 0, 1)
    assert torch.equal(fi.decode(VARIANTS["baseline-420"]), rgb)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_decode_is_pillows_rgb_bitwise(name):
    data = VARIANTS[name]
    before = fi.counts()
    got = fi.decode(data)
    want = torch.from_numpy(pillow(data).copy()).permute(2, 0, 1)
    assert got.dtype == torch.uint8 and got.is_contiguous() and torch.equal(got, want), name
    assert torch.equal(fi.decode(torch.frombuffer(bytearray(data), dtype=torch.uint8)), want)
    after = fi.counts()
    if name == "cmyk":  # what libjpeg cannot give as Pillow does goes through Pillow, counted
        assert after.get("pillow: CMYK", 0) == before.get("pillow: CMYK", 0) + 2
    elif ENGINE:
        assert after["engine"] == before.get("engine", 0) + 2


@needs_engine
@pytest.mark.parametrize("name", sorted(k for k in VARIANTS if k != "cmyk"))
def test_partial_decode_equals_the_full_decode_cropped(name):
    data = torch.frombuffer(bytearray(VARIANTS[name]), dtype=torch.uint8)
    full = pillow(VARIANTS[name])
    h, w = full.shape[:2]
    rng = random.Random(name)
    boxes = [(0, 0, h, w), (h - 1, w - 1, 1, 1), (0, w // 2, h, w - w // 2)]
    boxes += [(t, l, rng.randint(1, h - t), rng.randint(1, w - l)) for t, l in
              ((rng.randrange(h), rng.randrange(w)) for _ in range(12))]
    for top, left, bh, bw in boxes:
        got = _ext._C.jpeg_decode(data, 1, top, left, bh, bw, True).numpy()
        assert np.array_equal(got, full[top:top + bh, left:left + bw]), (name, top, left, bh, bw)


def test_boxes_follow_torchvisions_rule():
    t = fi.RandomResizedCrop(224, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), flip=0.5)
    flips = 0
    for i in range(400):
        b = t.box(375, 500, seed=3, epoch=1, index=i)
        assert 0 <= b.top and b.top + b.height <= 375 and 0 <= b.left and b.left + b.width <= 500
        area = b.height * b.width / (375 * 500)
        assert 0.08 * 0.9 <= area <= 1.0 and 3 / 4 * 0.9 <= b.width / b.height <= 4 / 3 * 1.1
        flips += b.flipped
        assert b == t.box(375, 500, seed=3, epoch=1, index=i)  # (seed, epoch, index) alone
    assert 150 < flips < 250
    assert t.box(375, 500, 3, 2, 0) != t.box(375, 500, 3, 1, 0)
    # the central fallback: an image far outside the ratio range with a scale no try can meet
    thin = fi.RandomResizedCrop(8, scale=(0.99, 1.0), ratio=(1.0, 1.0))
    assert tuple(thin.box(10, 2000, 0, 0, 0)) == (0, 995, 10, 10, False)
    d = Draws(1, 2, 3)
    assert all(0.0 <= d.uniform() < 1.0 for _ in range(1000))


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_a_sample_equals_the_reference_pipeline(name):
    data = VARIANTS[name]
    h, w = pillow(data).shape[:2]
    for t in (fi.RandomResizedCrop(32, flip=0.5), fi.RandomResizedCrop((24, 40), scale=(0.5, 1.0)),
              fi.CenterCrop(min(h, w), resize=None), fi.CenterCrop(8, resize=9)):
        for index in range(4):
            box = t.box(h, w, seed=0, epoch=0, index=index)
            src = fi.decoding.inspect(fi.decoding.as_bytes(data), name, 1 << 40)
            out = torch.empty(1, 3, *t.size, dtype=torch.uint8)
            fi.collate.run_batch([src], [t.plan(box, h, w, src.engine)], t.size, out, 1)
            want = reference.sample(data, t, box)
            assert torch.equal(out[0], want), (name, t, box)


@needs_engine
def test_differential_fuzz_against_the_reference():
    rng = np.random.default_rng(42)
    checked = 0
    for trial in range(60):
        h, w = int(rng.integers(1, 300)), int(rng.integers(1, 300))
        arr = photo(h, w, trial)
        if rng.random() < 0.2:
            arr = arr[..., 0]
        kw = {"quality": int(rng.integers(5, 100)), "progressive": bool(rng.integers(0, 2))}
        if arr.ndim == 3:
            kw["subsampling"] = int(rng.integers(0, 3))
        try:
            data = jpeg(arr, **kw)
        except OSError:  # a combination Pillow's encoder refuses
            continue
        size = (int(rng.integers(1, 80)), int(rng.integers(1, 80)))
        t = fi.RandomResizedCrop(size, scale=(float(rng.uniform(0.01, 0.5)), 1.0), flip=0.5)
        src = fi.decoding.inspect(fi.decoding.as_bytes(data), "fuzz", 1 << 40)
        boxes = [t.box(h, w, trial, e, i) for e in range(2) for i in range(4)]
        plans = [t.plan(b, h, w, src.engine) for b in boxes]
        out = torch.empty(len(boxes), 3, *size, dtype=torch.uint8)
        fi.collate.run_batch([src] * len(boxes), plans, size, out, 2)
        for b, got in zip(boxes, out):
            assert torch.equal(got, reference.sample(data, t, b)), (trial, h, w, kw, size, b)
            checked += 1
    assert checked > 300


def test_the_v1_pil_path_differs_by_a_level_or_two_at_most():
    data = VARIANTS["baseline-420"]
    t = fi.RandomResizedCrop(48)
    worst = 0
    for i in range(8):
        b = t.box(75, 101, 0, 0, i)
        ours, v1 = reference.sample(data, t, b).int(), reference.torchvision_v1(data, b, t.size).int()
        worst = max(worst, int((ours - v1).abs().max()))
    assert worst <= 2, worst  # the images guide states what was measured on photos


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("folder")
    write_folder(str(root))
    return str(root)


def test_the_folder_is_torchvisions_layout(folder):
    ds = fi.ImageFolder(folder, transform=fi.RandomResizedCrop(32))
    assert ds.classes == ["ant", "bee", "cow"] and ds.class_to_idx == {"ant": 0, "bee": 1, "cow": 2}
    names = [os.path.relpath(p, folder) for p, _ in ds.samples]
    assert names[:7] == ["ant/img00.jpg", "ant/img01.JPEG", "ant/img02.jpeg", "ant/img03.JPG", "ant/img04.jpg",
                         "ant/img05.JPEG", "ant/zz.png"]
    assert len(ds) == 21 and not any(n.endswith(".txt") for n in names) and ds.targets == [t for _, t in ds.samples]


def _reference_batch(ds, indices):
    images = []
    for i in indices:
        data = open(ds.samples[i][0], "rb").read()
        images.append(reference.sample(data, ds.transform, Box(*ds.crop_box(i))))
    return torch.stack(images), torch.tensor([ds.samples[i][1] for i in indices])


def test_samples_and_batches_equal_the_reference(folder):
    ds = fi.ImageFolder(folder, transform=fi.RandomResizedCrop(40, flip=0.5), seed=5)
    for epoch in (0, 3):
        ds.set_epoch(epoch)
        idx = list(range(len(ds)))
        want_x, want_y = _reference_batch(ds, idx)
        for i in (0, 6, 13):  # a JPEG, a PNG (Pillow, counted), another class
            x, y = ds[i]
            assert torch.equal(x, want_x[i]) and y == int(want_y[i])
        got = fastcollate.collate(ds.__getitems__(idx))
        assert isinstance(got, list) and torch.equal(got[0], want_x) and torch.equal(got[1], want_y)
        same = torch.utils.data.default_collate(ds.__getitems__(idx))  # any collate_fn sees samples
        assert torch.equal(same[0], want_x) and torch.equal(same[1], want_y)
    assert ds.stats()["fallbacks"] >= 3  # the PNGs
    val = fi.ImageFolder(folder, transform=fi.CenterCrop(32, resize=36))
    x, _ = val[2]
    data = open(val.samples[2][0], "rb").read()
    assert torch.equal(x, reference.sample(data, val.transform, Box(*val.crop_box(2))))


def _epochs(loader, ds, epochs=2):
    out = []
    for e in range(epochs):
        ds.set_epoch(e)
        out.append([(x.clone(), y.clone()) for x, y in loader])
    return out


def _same(a, b):
    return len(a) == len(b) and all(len(ea) == len(eb) and all(torch.equal(x1, x2) and torch.equal(y1, y2)
                                                                for (x1, y1), (x2, y2) in zip(ea, eb))
                                    for ea, eb in zip(a, b))


def test_the_same_batches_for_any_workers_and_either_loader(folder):
    ds = fi.ImageFolder(folder, transform=fi.RandomResizedCrop(24, flip=0.5), seed=1)
    want = _epochs(DataLoader(ds, batch_size=5), ds)
    assert not torch.equal(want[0][0][0], want[1][0][0])  # new crops each epoch
    for kw in ({"num_workers": 0}, {"num_workers": 1}, {"num_workers": 2}, {"num_workers": 2, "persistent_workers": True},
               {"num_workers": 2, "multiprocessing_context": "spawn", "persistent_workers": True}):
        for make in (DataLoader, fastcollate.DataLoader):
            got = _epochs(make(ds, batch_size=5, timeout=120 if kw["num_workers"] else 0, **kw), ds)
            assert _same(got, want), (make, kw)
    # shuffled: the same order from the same generator, so the same batches in any loader
    shuffled = _epochs(DataLoader(ds, batch_size=5, shuffle=True, generator=torch.Generator().manual_seed(3)), ds)
    assert not _same(shuffled, want)
    for workers in (0, 2):
        for make in (DataLoader, fastcollate.DataLoader):
            loader = make(ds, batch_size=5, shuffle=True, generator=torch.Generator().manual_seed(3),
                          num_workers=workers, timeout=120 if workers else 0)
            assert _same(_epochs(loader, ds), shuffled), (make, workers)
    loader = fastcollate.DataLoader(ds, batch_size=5, num_workers=2, collate_fn=torch.utils.data.default_collate)
    assert _same(_epochs(loader, ds), want)


def test_auto_mode_moves_between_threads_and_workers_with_the_same_batches(folder):
    from fastcollate.tuning import decide as plan

    ds = fi.ImageFolder(folder, transform=fi.RandomResizedCrop(24, flip=0.5), seed=6)
    want = _epochs(DataLoader(ds, batch_size=5), ds, epochs=4)
    auto = fastcollate.DataLoader(ds, batch_size=5, num_workers="auto")
    # the engine's threads in the main process, then workers, then threads again: one a new epoch
    script = [plan.Choice(0), plan.Choice(2, 2), plan.Choice(0)]

    def decide(st, m, budget):
        assert m.batches == -(-len(ds) // 5)  # each epoch measured whole, whatever made it
        if not script:
            st.settled = True
            return plan.Record(m.epoch, "keep", st.current, st.current, "settled", measured=m, settled=True)
        before, st.current = st.current, script.pop(0)
        return plan.Record(m.epoch, "change", before, st.current, "scripted", measured=m, predicted=1.0)

    auto._auto.decide = decide
    assert _same(_epochs(auto, ds, epochs=4), want)
    assert [r.after.workers for r in auto.auto_log if r.action == "change"] == [0, 2, 0]


def test_fastcollate_loader_advances_the_epoch_when_the_user_does_not(folder):
    ds = fi.ImageFolder(folder, transform=fi.RandomResizedCrop(16, flip=0.5), seed=2)
    loader = fastcollate.DataLoader(ds, batch_size=7)
    first, second = [x for x, _ in loader], [x for x, _ in loader]
    assert ds.epoch == 1 and not torch.equal(first[0], second[0])
    again = fastcollate.DataLoader(ds, batch_size=7)  # a new loader over the same dataset: the next epoch
    assert not torch.equal([x for x, _ in again][0], second[0]) and ds.epoch == 2
    ds.set_epoch(0)  # once the user sets epochs, the loader leaves them alone
    third = [x for x, _ in loader]
    assert ds.epoch == 0 and torch.equal(first[0], third[0])
    plain = fi.ImageFolder(folder, transform=fi.RandomResizedCrop(16), seed=2)
    with pytest.warns(UserWarning, match="without set_epoch repeats"):
        for _ in range(2):
            list(DataLoader(plain, batch_size=7))


@pytest.mark.parametrize("workers", [0, 2])
def test_resumed_stateful_loader_gives_the_same_batches(folder, workers):
    tdn = pytest.importorskip("torchdata.stateful_dataloader")

    def make(dataset):
        return tdn.StatefulDataLoader(dataset, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(0),
                                      num_workers=workers)

    ds = fi.ImageFolder(folder, transform=fi.RandomResizedCrop(16, flip=0.5), seed=4)
    ds.set_epoch(2)
    full = make(ds)
    it = iter(full)
    first = [next(it) for _ in range(2)]
    state = full.state_dict()
    rest = list(it)
    # a new process's view: a fresh dataset over the same folder, told the epoch it resumes
    fresh = fi.ImageFolder(folder, transform=fi.RandomResizedCrop(16, flip=0.5), seed=4)
    fresh.set_epoch(2)
    again = make(fresh)
    again.load_state_dict(state)
    resumed = list(again)
    assert len(first) == 2 and len(resumed) == len(rest) > 0
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(resumed, rest))


def _headers_only(data: bytes) -> bytes:
    """Every marker segment up to and including the start of scan, and no entropy data."""
    at = data.index(b"\xff\xda")
    return data[:at + 2 + int.from_bytes(data[at + 2:at + 4], "big")]


@pytest.mark.parametrize("bad, words", [
    (b"", "is empty"),
    (b"not an image at all", "not an image Pillow can identify"),
    (VARIANTS["baseline-420"][:300], "truncated"),
    (VARIANTS["baseline-420"][:len(VARIANTS["baseline-420"]) // 2], "truncated"),
    (VARIANTS["baseline-420"][:2] + b"\x00" * 400, "header cannot be read"),
    (_headers_only(VARIANTS["baseline-420"]), "truncated"),
], ids=["empty", "not-an-image", "header-cut", "truncated-half", "corrupt-header", "header-only"])
def test_bad_files_are_refused_by_name(tmp_path, bad, words):
    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    for k in range(3):
        (root / "a" / f"ok{k}.jpg").write_bytes(VARIANTS["baseline-444"])
    (root / "a" / "ok1.jpg").write_bytes(bad)
    ds = fi.ImageFolder(str(root), transform=fi.RandomResizedCrop(16))
    with pytest.raises(fi.DecodeError, match=words) as err:
        fastcollate.collate(ds.__getitems__([0, 1, 2]))
    assert "ok1.jpg (index 1)" in str(err.value)
    with pytest.raises(OSError, match=words):
        ds[1]
    with pytest.raises(fi.DecodeError, match=words):
        fi.decode(bad)
    # through a loader's worker it surfaces in the main process as torch's worker errors do
    for make in (DataLoader, fastcollate.DataLoader):
        with pytest.raises(fi.DecodeError, match="Caught DecodeError in DataLoader worker process 0") as err:
            list(make(ds, batch_size=3, num_workers=1, timeout=120))
        assert "ok1.jpg (index 1)" in str(err.value) and words in str(err.value)


def test_corrupt_entropy_data_is_an_error_or_pillows_pixels():
    data = bytearray(VARIANTS["baseline-420"])
    rng = np.random.default_rng(0)
    outcomes = {"both refused": 0, "equal pixels": 0}
    for trial in range(40):
        bad = bytearray(data)
        for pos in rng.integers(700, len(bad) - 2, 8):
            bad[pos] = int(rng.integers(0, 256))
        try:
            want = pillow(bytes(bad))
        except OSError:
            with pytest.raises(fi.DecodeError):
                fi.decode(bytes(bad))
            outcomes["both refused"] += 1
            continue
        try:
            got = fi.decode(bytes(bad))
        except fi.DecodeError:
            continue  # refused where Pillow got something: never wrong pixels
        assert np.array_equal(got.permute(1, 2, 0).numpy(), want), trial
        outcomes["equal pixels"] += 1
    assert outcomes["both refused"] >= 1 and outcomes["equal pixels"] >= 20, outcomes  # both routes were taken


def test_a_pixel_limit_refuses_before_decoding(tmp_path):
    data = VARIANTS["224x224"]
    with pytest.raises(fi.DecodeError, match="over the limit of 1000"):
        fi.decode(data, max_pixels=1000)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "big.jpg").write_bytes(data)
    ds = fi.ImageFolder(str(tmp_path), transform=fi.RandomResizedCrop(8), max_pixels=50_000)
    with pytest.raises(fi.DecodeError, match=r"big.jpg \(index 0\).*50000"):
        ds[0]


def test_the_default_pixel_limit_is_where_pillow_refuses(tmp_path, monkeypatch):
    # Pillow warns above MAX_IMAGE_PIXELS and refuses above twice that (DecompressionBombError):
    # the default refuses what Pillow refuses, so that what torchvision's ImageFolder loads loads here
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 224 * 224 // 2 - 1)  # 224x224 is just over twice it
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "big.jpg").write_bytes(VARIANTS["224x224"])
    with pytest.raises(Image.DecompressionBombError):
        Image.open(tmp_path / "c" / "big.jpg").convert("RGB")
    with pytest.raises(fi.DecodeError, match=r"big.jpg \(index 0\)"):
        fi.ImageFolder(str(tmp_path), transform=fi.RandomResizedCrop(8))[0]
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 224 * 224 // 2)  # exactly twice: Pillow only warns
    with pytest.warns(Image.DecompressionBombWarning):
        Image.open(tmp_path / "c" / "big.jpg").convert("RGB")
    assert fi.ImageFolder(str(tmp_path), transform=fi.RandomResizedCrop(8))[0][0].shape == (3, 8, 8)


def test_decode_collate_for_streamed_samples():
    a, b = VARIANTS["baseline-420"], VARIANTS["grayscale"]
    t = fi.CenterCrop(40, resize=48)
    collate = fi.decode_collate(t)
    got = collate([(a, 1), (b, 0)])
    want = torch.stack([reference.sample(x, t, t.box(*pillow(x).shape[:2])) for x in (a, b)])
    assert torch.equal(got[0], want) and got[1].tolist() == [1, 0]
    wds = collate([{"jpg": a, "cls": 3, "__key__": "x"}, {"jpg": b, "cls": 4, "__key__": "y"}])
    assert torch.equal(wds["jpg"], want) and wds["cls"].tolist() == [3, 4] and wds["__key__"] == ["x", "y"]
    hf = collate([{"image": {"bytes": a, "path": None}, "label": 1}, {"image": {"bytes": b, "path": None}, "label": 2}])
    assert torch.equal(hf["image"], want) and hf["label"].tolist() == [1, 2]
    with pytest.raises(TypeError, match="no encoded image"):
        collate([(1, 2)])


@needs_engine
@pytest.mark.parametrize("workers", [0, 2])
def test_no_fd_or_memory_growth_over_epochs(folder, workers):
    import gc

    import psutil

    ds = fi.ImageFolder(folder, transform=fi.RandomResizedCrop(32, flip=0.5))
    # with workers: persistent ones, whose batches come through the ring's shared slots
    loader = fastcollate.DataLoader(ds, batch_size=8, num_workers=workers, persistent_workers=workers > 0,
                                    timeout=120 if workers else 0)
    me = psutil.Process()

    def usage():
        gc.collect()
        pids = [me.pid] + [w.pid for w in (loader._iterator._workers if workers else ())]
        return {pid: (psutil.Process(pid).num_fds(), psutil.Process(pid).memory_info().rss) for pid in pids}

    for _ in range(3):
        list(loader)
    before = usage()
    assert len(before) == 1 + workers
    for _ in range(20):
        list(loader)
    after = usage()
    assert after.keys() == before.keys()  # the same persistent workers, none re-spawned
    for pid, (fds, rss) in before.items():
        assert after[pid][0] <= fds, (pid, before, after)
        assert after[pid][1] - rss < 16 << 20, (pid, before, after)


def test_the_trace_names_the_decode_the_datasets_work(folder):
    ds = fi.ImageFolder(folder, transform=fi.RandomResizedCrop(32))
    mon = fastcollate.StallMonitor(trace=True)
    for batch in mon.wrap(fastcollate.DataLoader(ds, batch_size=7, num_workers=1, timeout=120)):
        with mon.compute():
            pass
    stages = mon.report()["stages"]
    assert stages["fetch"]["total_s"] > 5 * stages["collate"]["total_s"], stages  # decoded in the collate hook


@pytest.mark.parametrize("workers", [0, 1])
def test_the_trace_shows_reading_decoding_and_resizing_inside_the_fetch_and_counts_fallbacks(folder, workers, tmp_path):
    import json

    ds = fi.ImageFolder(folder, transform=fi.RandomResizedCrop(32))
    pillow_decoded = sum(not s.engine for s in ds._sources(list(range(len(ds))), 1))
    assert 0 < pillow_decoded < len(ds)  # the folder holds files only Pillow decodes
    mon = fastcollate.StallMonitor(trace=True)
    for _ in mon.wrap(fastcollate.DataLoader(ds, batch_size=7, num_workers=workers, timeout=120 if workers else 0)):
        with mon.compute():
            pass
    r = mon.report()
    parts, batches = r["fetch_parts"], -(-len(ds) // 7)
    assert (parts["batches"], parts["images"], parts["fallbacks"]) == (batches, len(ds), pillow_decoded), parts
    assert set(parts["wall_ms"]) == {"read files", "decode + resize"} and min(parts["wall_ms"].values()) > 0
    assert parts["decode_cpu_ms"] > 0 and parts["resize_cpu_ms"] > 0
    text = mon.format(r)
    assert "inside the fetch, a batch: read files " in text and f"{pillow_decoded} of {len(ds)} images decoded by Pillow" in text
    with open(mon.save_trace(str(tmp_path / "trace.json"))) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    fetches = {(e["args"]["epoch"], e["args"]["index"]): e for e in events if e["name"] == "fetch"}
    for name in ("read files", "decode + resize"):
        inner = [e for e in events if e["name"] == name]
        assert len(inner) == batches, name
        for e in inner:  # nested: inside its batch's fetch, on the same track
            f = fetches[e["args"]["epoch"], e["args"]["index"]]
            assert (f["pid"], f["tid"]) == (e["pid"], e["tid"]) and f["ts"] <= e["ts"]
            assert e["ts"] + e["dur"] <= f["ts"] + f["dur"] + 1e-3, (e, f)


def test_the_example_trains_on_an_image_folder():
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, os.path.join(root, "examples", "image_folder_train.py"), "--epochs", "3"],
                         capture_output=True, text=True, timeout=600, cwd=root)
    assert out.returncode == 0, out.stderr[-3000:]
    losses = [float(line.split("mean loss ")[1].split(",")[0]) for line in out.stdout.splitlines() if "mean loss" in line]
    assert len(losses) == 3 and losses[-1] < losses[0], out.stdout


@needs_engine
def test_fast_mode_is_close_to_exact_on_the_box_it_reports():
    data = jpeg(photo(900, 1200, 11), quality=90)
    src = fi.decoding.inspect(fi.decoding.as_bytes(data), "photo", 1 << 40)
    fast, exact = fi.RandomResizedCrop(96, mode="fast"), fi.RandomResizedCrop(96)
    scaled = 0
    for i in range(24):
        plan = fast.plan(fast.box(900, 1200, 0, 0, i), 900, 1200, True)
        if plan.denom == 1:
            assert plan == exact.plan(plan.box, 900, 1200, True)  # nothing to scale: exact itself
            continue
        scaled += 1
        d = plan.denom
        assert plan.box.top == plan.top * d and plan.box.left == plan.left * d  # snapped to the scaled grid
        out = torch.empty(2, 3, 96, 96, dtype=torch.uint8)
        fi.collate.run_batch([src, src], [plan, exact.plan(plan.box, 900, 1200, True)], (96, 96), out, 1)
        diff = (out[0].double() - out[1].double()).abs()
        psnr = 10 * torch.log10(255.0 ** 2 / (diff ** 2).mean().clamp_min(1e-12))
        assert diff.mean() <= 3.0 and psnr >= 30, (i, plan, float(diff.mean()), float(psnr))
    assert scaled >= 4
    assert fast.plan(fast.box(900, 1200, 0, 0, 0), 900, 1200, scalable=False).denom == 1  # Pillow's: exact


def test_repeats_are_counted_across_fresh_workers_and_empty_classes_refused(folder, tmp_path):
    ds = fi.ImageFolder(folder, transform=fi.RandomResizedCrop(16), seed=2)
    for _ in range(2):  # torch's loader, fresh workers each epoch, no set_epoch
        list(DataLoader(ds, batch_size=7, num_workers=2, timeout=120))
    assert int(ds._epoch[5]) == 1  # said (in a worker: its stderr), once for every process
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "1.jpg").write_bytes(VARIANTS["7x5"])
    with pytest.raises(FileNotFoundError, match="class folder.s. b"):
        fi.ImageFolder(str(tmp_path), transform=fi.RandomResizedCrop(4))


def test_the_stages_last_copy_under_address_and_undefined_sanitizers(tmp_path):
    import shutil
    import subprocess

    if shutil.which("g++") is None:
        pytest.skip("no g++ to build the sanitized harness")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    exe = tmp_path / "harness"
    engine = [f"{root}/csrc/engine/{f}.cpp" for f in ("transpose", "pool", "copy")]
    build = subprocess.run(["g++", "-std=c++17", "-O1", "-g", "-fsanitize=address,undefined", "-fno-omit-frame-pointer",
                            "-fno-sanitize-recover=all", f"-I{root}/csrc", f"{root}/tests/transpose_asan_harness.cpp",
                            *engine, "-lpthread", "-o", str(exe)], capture_output=True, text=True, timeout=300)
    if build.returncode != 0:
        pytest.skip(f"the sanitized harness does not build here: {build.stderr[-300:]}")
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0"))
    assert run.returncode == 0 and "3000 shapes ok" in run.stdout, (run.stdout + run.stderr)[-4000:]


@pytest.mark.skipif(not ENGINE, reason=str(fi.why_not()))
def test_the_decoder_under_address_and_undefined_sanitizers(tmp_path):
    import shutil
    import subprocess

    if shutil.which("g++") is None:
        pytest.skip("no g++ to build the sanitized harness")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    exe = tmp_path / "harness"
    build = subprocess.run(["g++", "-std=c++17", "-O1", "-g", "-fsanitize=address,undefined", "-fno-omit-frame-pointer",
                            "-fno-sanitize-recover=all", "-DFASTCOLLATE_WITH_JPEG=1", f"-I{root}/csrc",
                            f"{root}/tests/jpeg_asan_harness.cpp", f"{root}/csrc/engine/jpeg.cpp", "-ljpeg", "-o", str(exe)],
                           capture_output=True, text=True, timeout=300)
    if build.returncode != 0:
        pytest.skip(f"the sanitized harness does not build here: {build.stderr[-300:]}")
    rng = np.random.default_rng(11)
    files = []
    for name, data in VARIANTS.items():  # each variant whole, cut short, and mutated
        cases = [data] + [data[:c] for c in (2, 20, 300, len(data) // 2, len(data) - 2)]
        for t in range(12):
            bad = bytearray(data)
            for pos in rng.integers(2, len(bad), int(rng.integers(1, 20))):
                bad[pos] = int(rng.integers(0, 256))
            cases.append(bytes(bad))
        for k, c in enumerate(cases):
            path = tmp_path / f"{name}-{k}.jpg"
            path.write_bytes(c)
            files.append(str(path))
    run = subprocess.run([str(exe), *files], capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0"))
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    assert "decodes ok" in run.stdout
