"""The peers table's plumbing: every installed peer runs the padded workload and its first batch
equals torch's (the check `bench --peers` prints as 'equal batches'); Ray Data, where installed,
among them, run in a process of its own and that process ended after the run."""
import importlib.util

import pytest

from fastcollate._bench import peers as pb


def test_every_installed_peer_gives_torchs_batches_on_the_padded_rows():
    result = pb.run_peers(workers=2, rounds=1, quick=True, only=["padded"])
    rows = {r["peer"]: r for r in result["rows"]}
    assert {"torch DataLoader", "fastcollate.DataLoader"} <= set(rows)
    for peer, r in rows.items():
        assert r["equal"] is True, (peer, r["equal"])
        assert r["samples_per_s"] > 0 and r["first_batch_s"] > 0, r
    assert rows["torch DataLoader"]["vs_torch"] == pytest.approx(1.0)
    table = pb.format_peers(result)
    assert "fastcollate.DataLoader" in table and "| padded |" in table
    if importlib.util.find_spec("ray") is not None and importlib.util.find_spec("pydantic") is not None:
        assert {"Ray Data iter_torch_batches", "Ray Data + fastcollate ArrowCollate"} <= set(rows)
        assert "run in a process of its own" in table
        assert not pb._RAY  # its process asked to quit and waited for
