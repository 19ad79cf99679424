"""ArrayDataset.from_hf over real `datasets.Dataset`s: samples are the dataset's own rows; a
gathered batch (Arrow buffers, every chunk, indices mappings) equals default_collate / the
padding reference / transformers' DataCollatorWithPadding of those rows."""
import pickle

import numpy as np
import pytest
import torch
import torch.utils.data as tud
from torch.utils.data import default_collate

datasets = pytest.importorskip("datasets")

import fastcollate  # noqa: E402
from fastcollate import ArrayDataset, Collator  # noqa: E402
from helpers import assert_same  # noqa: E402


def table(n=40, seed=0):
    rng = np.random.default_rng(seed)
    lens = rng.integers(0, 10, n)
    return {
        "input_ids": [rng.integers(0, 30000, k).tolist() for k in lens],
        "scores": [rng.standard_normal(k).astype(np.float32).tolist() for k in lens],
        "flags": [(rng.random(k) > 0.5).tolist() for k in lens],
        "label": rng.integers(0, 5, n).tolist(),
        "weight": rng.standard_normal(n).tolist(),
        "keep": (rng.random(n) > 0.5).tolist(),
        "pair": [[int(a), int(a) + 1] for a in rng.integers(0, 9, n)],
        "text": [f"row {i}" for i in range(n)],
    }


def variants():
    base = datasets.Dataset.from_dict(table())
    features = base.features.copy()
    features["input_ids"] = datasets.Sequence(datasets.Value("int32"))  # as tokenizers' map stores them
    typed = base.cast(features)
    chunked = typed.map(lambda b: b, batched=True, batch_size=7)  # several Arrow chunks
    return {"plain": base, "int32": typed, "chunked": chunked, "shuffled": chunked.shuffle(seed=1),
            "selected": chunked.select([5, 3, 3, 30, 0, 12, 39, 8]), "sliced": chunked.select(range(9, 33))}


NUMERIC = ["input_ids", "scores", "flags", "label", "weight", "keep"]


def gathered(collate_fn, ds, idx):
    before = fastcollate.stats()["gathered_batches"]
    out = collate_fn(ds.__getitems__(idx))
    return out, fastcollate.stats()["gathered_batches"] - before


@pytest.mark.parametrize("name", list(variants()))
def test_samples_are_the_datasets_rows_and_padding_matches(name):
    hf = variants()[name]
    ds = ArrayDataset.from_hf(hf, columns=NUMERIC)
    assert len(ds) == len(hf)
    for i in (0, len(hf) - 1, 3):
        assert ds[i] == {k: hf[i][k] for k in NUMERIC}
    c = Collator(pad={"input_ids": 0, "scores": -1.0, "flags": 0}, pad_to_multiple_of=4, lengths_key="n")
    rng = np.random.default_rng(len(name))
    for _ in range(5):
        idx = rng.integers(0, len(hf), 9).tolist()
        want = c.pad.collate([{k: hf[i][k] for k in NUMERIC} for i in idx])
        got, n = gathered(c, ds, idx)
        assert n == 1
        assert_same(got, want)


def test_unpadded_batches_are_default_collates():
    hf = variants()["chunked"]
    ds = ArrayDataset.from_hf(hf, columns=["label", "weight", "keep", "pair"])
    idx = [4, 4, 0, 17, 39]
    got, n = gathered(fastcollate.collate, ds, idx)  # equal-length lists: one [B] tensor per position
    assert n == 1
    assert_same(got, default_collate([{k: hf[i][k] for k in ds.columns} for i in idx]))
    # converted on the way into the per-position block: int32 -> int64, float32 -> float64
    narrow = datasets.Dataset.from_dict({"pair": [[i, -i, 7] for i in range(12)],
                                         "xy": [[i / 3, -i / 7] for i in range(12)]},
                                        features=datasets.Features({"pair": datasets.Sequence(datasets.Value("int32")),
                                                                    "xy": datasets.Sequence(datasets.Value("float32"))}))
    nds = ArrayDataset.from_hf(narrow)
    got, n = gathered(fastcollate.collate, nds, [11, 0, 5, 5])
    assert n == 1
    assert_same(got, default_collate([narrow[i] for i in [11, 0, 5, 5]]))
    ragged = ArrayDataset.from_hf(hf, columns=["input_ids"])
    with pytest.raises(RuntimeError, match="equal size"):
        fastcollate.collate(ragged.__getitems__([0, 1, 2, 3]))


def test_equals_data_collator_with_padding():
    transformers = pytest.importorskip("transformers")
    from test_hf import rows, tokenizer

    tok = tokenizer()
    data = rows(tok)
    hf = datasets.Dataset.from_list(data)
    ds = ArrayDataset.from_hf(hf)
    theirs = transformers.DataCollatorWithPadding(tok, pad_to_multiple_of=8)
    ours = Collator.for_tokenizer(tok, pad_to_multiple_of=8)
    for i in range(0, len(data), 8):
        idx = list(range(i, min(i + 8, len(data))))
        got, n = gathered(ours, ds, idx)
        assert n == 1
        want = dict(theirs([hf[j] for j in idx]))
        assert sorted(got) == sorted(want)
        for k in want:
            assert_same(got[k], want[k], k)


def test_loader_workers_spawn_and_lengths():
    hf = variants()["shuffled"]
    ds = ArrayDataset.from_hf(hf, columns=["input_ids", "label"])
    assert ds.lengths("input_ids").tolist() == [len(hf[i]["input_ids"]) for i in range(len(hf))]
    c = Collator(pad={"input_ids": 0})
    sampler = fastcollate.LengthGroupedSampler(ds.lengths("input_ids"), batch_size=8, seed=2)
    loader = fastcollate.DataLoader(ds, batch_sampler=sampler, num_workers=2, collate_fn=c,
                                    multiprocessing_context="spawn")
    want = [c.pad.collate([{k: hf[i][k] for k in ds.columns} for i in b]) for b in sampler]
    for a, b in zip(loader, want, strict=True):
        assert_same(a, b)
    assert loader.stats()["ring_hits"] == len(want)
    again = pickle.loads(pickle.dumps(ds))
    assert_same(c(again.__getitems__([1, 2])), c(ds.__getitems__([1, 2])))


def test_bad_columns_and_nulls():
    hf = variants()["plain"]
    with pytest.raises(TypeError, match=r"column 'text' is string"):
        ArrayDataset.from_hf(hf)
    with pytest.raises(KeyError, match="no column 'nope'"):
        ArrayDataset.from_hf(hf, columns=["nope"])
    with pytest.raises(TypeError, match="datasets.Dataset"):
        ArrayDataset.from_hf({"a": [1]})
    holes = datasets.Dataset.from_dict({"ids": [[1, 2], None, [3]], "y": [1, None, 2]})
    ds = ArrayDataset.from_hf(holes)
    assert ds[1] == {"ids": None, "y": None}
    # rows with nulls: the ordinary path, and default_collate's own error
    with pytest.raises(TypeError) as theirs:
        default_collate([holes[i] for i in range(3)])
    with pytest.raises(type(theirs.value)):
        fastcollate.collate(ds.__getitems__([0, 1, 2]))
    assert_same(fastcollate.collate(ds.__getitems__([0, 0])), default_collate([holes[0], holes[0]]))


def test_a_dataset_on_disk_memory_mapped(tmp_path):
    hf = variants()["chunked"]
    hf.save_to_disk(str(tmp_path / "ds"))
    on_disk = datasets.load_from_disk(str(tmp_path / "ds")).shuffle(seed=4)
    ds = ArrayDataset.from_hf(on_disk, columns=["input_ids", "scores", "label"])
    c = Collator(pad={"input_ids": 0, "scores": 0.0}, max_length=6, padding_side="left")
    loader = fastcollate.DataLoader(ds, batch_size=8, num_workers=2, collate_fn=c, multiprocessing_context="spawn")
    want = [c.pad.collate([{k: on_disk[i][k] for k in ds.columns} for i in range(s, min(s + 8, len(ds)))])
            for s in range(0, len(ds), 8)]
    for a, b in zip(loader, want, strict=True):
        assert_same(a, b)
    assert loader.stats()["ring_hits"] == len(want)
