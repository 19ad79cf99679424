"""benchmarks/node_cache_sim.py: its caches follow Cached's rules (fill once, first come, never
evict), its hit rates land on the closed forms, the node-affine sampler's node cache holds its part
and hits every fetch after the first epoch, and the tables in the docs are what it computes."""
from __future__ import annotations

import os
import re
import sys

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import node_cache_sim as sim  # noqa: E402


def test_a_cache_fills_once_first_come_and_never_evicts():
    c = sim.Cache(10, capacity=2)
    assert c.fetch(np.array([3, 1, 3, 2])).tolist() == [False, False, True, False]  # 3 repeats its own insert
    assert sorted(np.flatnonzero(c.held)) == [1, 3] and c.count == 2                 # 2 came when it was full
    assert c.fetch(np.array([2, 1, 3])).tolist() == [False, True, True]
    assert c.fetch(np.array([], dtype=np.int64)).tolist() == []


@pytest.mark.parametrize("nodes, per_node", [(1, 2), (2, 2), (4, 2), (2, 4)])
def test_hit_rates_land_on_the_closed_forms(nodes, per_node):
    rows = sim.simulate(6000, nodes, per_node, [1.0, 0.5, 0.25], epochs=4)
    for row in rows:
        for epoch, hit in enumerate(row.hit):
            want = sim.expected_hit(row.scheme, nodes, per_node, row.budget, epoch)
            assert abs(hit - want) < 0.03, (row, epoch, want)
        assert all(h <= row.budget + 1e-9 or row.scheme in ("affine", "store") for h in row.held)


def test_the_affine_sampler_holds_its_part_and_hits_everything_after_the_first_epoch():
    for row in sim.simulate(1001, 4, 2, [1.0, 0.26], epochs=3, schemes=["affine"]):
        assert row.hit[1:] == [1.0, 1.0] and row.rank_range == (1.0, 1.0)
        assert row.held == [251 / 1001] * 3  # the largest part, 1001 = 251 + 3 x 250
    (short,) = sim.simulate(1001, 4, 2, [0.25], epochs=2, schemes=["affine"])  # 250 of 251: one sample never cached
    assert short.held[-1] == 250 / 1001 and 0.99 < short.hit[1] < 1.0
    one_node = sim.simulate(500, 1, 4, [0.5], epochs=3, schemes=["node", "affine"])
    assert one_node[0].hit == one_node[1].hit  # with one node the sampler is DistributedSampler


def test_the_store_serves_the_rest_from_other_nodes():
    (row,) = sim.simulate(2000, 4, 2, [0.25], epochs=2, schemes=["store"])
    assert row.hit[1] == 1.0 and abs(row.remote[1] - 0.75) < 0.03


def test_the_samplers_batches_match_their_closed_forms():
    st = sim.batch_stats(2000, 2, 2, 4, epochs=10)
    assert abs(st.theory_affine / st.theory_ds - 1) < 0.01
    for measured, theory in ((st.var_ds, st.theory_ds), (st.var_affine, st.theory_affine)):
        assert abs(measured / theory - 1) < 0.15  # 1250 steps: a few percent of noise
    assert st.seen_affine == 0.5 and st.seen_ds > 0.99


def test_the_command_writes_its_tables_and_refuses_bad_arguments(tmp_path, capsys):
    out = tmp_path / "t.md"
    args = ["--n", "400", "--nodes", "1,2", "--per-node", "2", "--budgets", "1", "--epochs", "2",
            "--stats-epochs", "2", "--markdown", str(out)]
    assert sim.main(args) == 0
    text = out.read_text()
    assert text.startswith("# ") and "--n 400 --nodes 1,2" in text
    assert len(re.findall(r"^\| [12] \| 2 \| 100% \|", text, flags=re.M)) == 8  # 2 layouts x 4 caches
    assert "## The samplers' batches" in text
    assert sim.main(["--budgets", "1.5"]) == 2
    assert sim.main(["--schemes", "lru"]) == 2
    assert "node_cache_sim: error:" in capsys.readouterr().err


def test_the_docs_tables_are_what_the_simulation_computes():
    page = open(os.path.join(ROOT, "docs", "benchmarks", "node_cache.md")).read()
    made = re.search(r"with torch (\S+)\. The simulation uses a dataset of (\d+) equal-sized samples,\s+seed (\d+), "
                     r"(\d+) epochs", page)
    assert made, "the page names how it was made"
    if made.group(1) != torch.__version__:
        pytest.skip(f"the page was made with torch {made.group(1)}; randperm may differ in {torch.__version__}")
    n, seed, epochs = int(made.group(2)), int(made.group(3)), int(made.group(4))
    rows = sim.simulate(n, 4, 2, [1.0, 0.5, 0.25], epochs, seed)
    for line in sim.cache_table(rows)[2:]:
        assert line in page, f"the docs' table is out of date (regenerate it with its command): {line}"


def test_the_node_page_quotes_the_generated_tables_row_for_row():
    generated = open(os.path.join(ROOT, "docs", "benchmarks", "node_cache.md")).read().splitlines()
    quoted = [line for line in open(os.path.join(ROOT, "docs", "node.md")).read().splitlines()
              if re.match(r"\| \d", line)]
    assert quoted and [line for line in quoted if line not in generated] == []
