"""Many Python threads collating at once (the copy runs with the GIL released): every result
is checked against default_collate."""
import threading

import torch
from torch.utils.data import default_collate

import fastcollate
from helpers import assert_same


def test_eight_threads_at_once():
    errors = []
    start = threading.Barrier(8)

    def work(tid):
        try:
            start.wait()
            c = fastcollate.Collator(num_threads=1 + tid % 3)
            for it in range(40):
                g = torch.Generator().manual_seed(tid * 1000 + it)
                n = 1 + (tid + it) % 9
                batch = [{"x": torch.randn(64, 129, generator=g), "y": tid, "z": [float(it), torch.randn(3, generator=g)]}
                         for _ in range(n)]
                held = c(batch)
                assert_same(held, default_collate(batch))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors[0]
