"""WebDataset: tar shards written in a temporary directory, read back with `wds.WebDataset(...)
.decode().to_tuple(...)`. `.batched(n, collation_fn=fastcollate.collate)` gives exactly
`.batched(n, collation_fn=default_collate)`'s batches, iterated directly, through a DataLoader
with workers and through `wds.WebLoader` (re-batched in the main process too); and
`fastcollate.DataLoader(pipeline, batch_size=n, num_workers=k)` -- the loader batches, so its
workers collate into the ring -- gives torch's DataLoader's batches, every one a ring hit.
(`wds.WebLoader` makes torch's DataLoader itself: the ring is reachable only through a
fastcollate.DataLoader.)"""
import numpy as np
import pytest
from torch.utils.data import DataLoader, default_collate

wds = pytest.importorskip("webdataset")

import fastcollate  # noqa: E402
from helpers import assert_same  # noqa: E402

SHARDS, PER_SHARD = 4, 25
FIELDS = ("png", "feat.npy", "cls", "txt", "json")


@pytest.fixture(scope="module")
def urls(tmp_path_factory):
    d = tmp_path_factory.mktemp("wds")
    rng = np.random.default_rng(0)
    for s in range(SHARDS):
        with wds.TarWriter(str(d / f"shard-{s:04d}.tar")) as w:
            for j in range(PER_SHARD):
                i = s * PER_SHARD + j
                w.write({"__key__": f"{i:06d}",
                         "png": rng.integers(0, 255, (12, 10, 3), dtype=np.uint8),   # an image, PNG-encoded
                         "feat.npy": rng.standard_normal(6).astype(np.float32),
                         "cls": i, "txt": f"sample {i}", "json": {"w": i / 7, "pair": [i, -i]}})
    return str(d / f"shard-{{0000..{SHARDS - 1:04d}}}.tar")


def pipeline(urls, fields=FIELDS):
    # images decoded to uint8 CHW tensors, .npy to numpy, .cls to int, .txt to str, .json to dict
    return wds.WebDataset(urls, shardshuffle=False).decode("torchrgb8").to_tuple(*fields)


def check_all(got, want):
    assert len(got) == len(want) > 0
    for g, w in zip(got, want, strict=True):
        assert_same(g, w)
    labels = sorted(i for b in got for i in b[2].tolist())
    assert labels == list(range(SHARDS * PER_SHARD))


def test_batched_with_fastcollate_is_default_collate(urls):
    got = list(pipeline(urls).batched(8, collation_fn=fastcollate.collate))
    want = list(pipeline(urls).batched(8, collation_fn=default_collate))
    check_all(got, want)
    assert got[0][0].dtype.is_floating_point is False and got[0][0].shape == (8, 3, 12, 10)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_batched_in_dataloader_workers(urls, num_workers):
    def run(collate):
        loader = DataLoader(pipeline(urls).batched(8, collation_fn=collate), batch_size=None, num_workers=num_workers)
        return list(loader)

    got, want = run(fastcollate.collate), run(default_collate)
    check_all(got, want)
    if num_workers:  # collated in a worker: one shared arena, as default_collate's are shared
        assert got[0][0].is_shared() and want[0][0].is_shared()


def test_webloader_and_rebatching_in_the_main_process(urls):
    fields = FIELDS[:4]  # wds' unbatched() splits tuples of tensors and lists, not dicts

    def run(collate):
        loader = wds.WebLoader(pipeline(urls, fields).batched(4, collation_fn=collate), batch_size=None, num_workers=2)
        return list(loader.unbatched().batched(8, collation_fn=collate))

    check_all(run(fastcollate.collate), run(default_collate))


def test_the_ring_when_the_loader_batches(urls):
    want = list(DataLoader(pipeline(urls), batch_size=8, num_workers=2))
    loader = fastcollate.DataLoader(pipeline(urls), batch_size=8, num_workers=2)
    got = []
    for batch in loader:  # each batch released before the next, as a training loop does
        got.append(batch[2].clone())
        assert_same(batch, want[len(got) - 1])
    assert sorted(i for b in got for i in b.tolist()) == list(range(SHARDS * PER_SHARD))
    stats = loader.stats()
    assert stats["ring_hits"] == len(want) and stats["ring_fallbacks"] == 0, stats
