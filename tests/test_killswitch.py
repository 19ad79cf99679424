"""FASTCOLLATE_DISABLE=1 is the instant rollback to default_collate; a missing compiled module
falls back to the Python reference with one warning."""
import os
import subprocess
import sys
import textwrap

import torch
from torch.utils.data import default_collate

import fastcollate
from helpers import assert_same

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_disable_calls_default_collate(monkeypatch):
    import torch.utils.data as tud

    calls = []
    real = tud.default_collate
    coll = sys.modules["fastcollate.core.collator"]
    monkeypatch.setattr(coll, "default_collate", lambda b: calls.append(1) or real(b))
    monkeypatch.setenv("FASTCOLLATE_DISABLE", "1")
    batch = [{"x": torch.ones(2)}, {"x": torch.zeros(2)}]
    fastcollate.reset_stats()
    assert_same(fastcollate.collate(batch), default_collate(batch), contiguous=False)
    assert calls == [1]
    assert fastcollate.stats()["disabled_batches"] == 1
    monkeypatch.setenv("FASTCOLLATE_DISABLE", "0")
    fastcollate.collate(batch)
    assert calls == [1]


def test_fallback_when_the_compiled_module_cannot_load():
    code = textwrap.dedent("""
        import sys, warnings
        class Block:
            def find_spec(self, name, path, target=None):
                if name == "fastcollate._C":
                    raise ImportError("blocked for the test")
        sys.meta_path.insert(0, Block())
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            import fastcollate
        assert fastcollate.backend() == "python", fastcollate.backend()
        assert sum("pure-Python fallback" in str(x.message) for x in w) == 1, [str(x.message) for x in w]
        import torch
        from torch.utils.data import default_collate
        b = [{"x": torch.ones(2), "y": 1, "s": "a"}, {"x": torch.zeros(2), "y": 2, "s": "b"}]
        out = fastcollate.collate(b)
        ref = default_collate(b)
        assert torch.equal(out["x"], ref["x"]) and torch.equal(out["y"], ref["y"]) and out["s"] == ref["s"]
        assert fastcollate.stats()["python_batches"] == 1
        try:
            fastcollate.Collator(backend="cpp")
        except RuntimeError as e:
            assert "not available" in str(e)
        else:
            raise AssertionError("backend='cpp' must refuse without the engine")
        print("ok")
    """)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_python_backend_is_selectable():
    batch = [(torch.ones(3), 1.5), (torch.zeros(3), 2.5)]
    assert_same(fastcollate.Collator(backend="python")(batch), default_collate(batch), contiguous=False)
