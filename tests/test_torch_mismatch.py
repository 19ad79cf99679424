"""The engine records the torch it was built against; a different torch at import gives one clear
ImportError (both builds, what differs, the rebuild command) before the module is loaded, unless
the user opts into the pure-Python path.

Only one torch can be installed here (the others are multi-GB CUDA wheels), so the subprocess tests
alter the build record in a temp copy of the package (a checkout's or an installed one) and run
`import fastcollate` from that copy. The rules themselves are checked on records directly.
"""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import fastcollate
from fastcollate import _buildinfo, _ext
from package_copy import OLDER, copy_package

PKG = os.path.dirname(os.path.abspath(fastcollate.__file__))
NOW = _buildinfo.running()


def _rec(**kw):
    return {**NOW, **kw}


# ---- the rules ------------------------------------------------------------------------------------

def test_the_same_build_is_no_mismatch():
    assert _buildinfo.mismatches(_rec(), NOW) == []


@pytest.mark.parametrize("built, now, words", [
    (dict(torch="2.12.0+cpu"), dict(torch="2.13.0+cpu"), "torch release differs (2.12.0 vs 2.13.0)"),
    (dict(torch="2.14.0.dev20260501+cpu"), dict(torch="2.14.0.dev20260502+cpu"), "torch release differs"),
    (dict(cxx11_abi=False), dict(cxx11_abi=True), "C++11 ABI flag differs (0 vs 1)"),
    (dict(torch_cuda="12.8"), dict(torch_cuda=None), "CUDA 12.8 build of torch and this torch is a CPU build"),
    (dict(torch_cuda=None), dict(torch_cuda="12.8"), "CPU build of torch (no CUDA kernels) and this torch is a CUDA 12.8"),
    (dict(torch_cuda="12.8"), dict(torch_cuda="13.0"), "CUDA major version differs (12.8 vs 13.0)"),
    (dict(python="3.10"), dict(python="3.11"), "Python version differs (3.10 vs 3.11)"),
])
def test_each_rule_names_what_differs(built, now, words):
    base = dict(torch="2.13.0+cpu", torch_cuda=None, cxx11_abi=True, python="3.11")
    problems = _buildinfo.mismatches({**base, **built}, {**base, **now})
    assert len(problems) == 1 and words in problems[0], problems


@pytest.mark.parametrize("built, now", [
    (dict(torch="2.13.0+cu126", torch_cuda="12.6"), dict(torch="2.13.0+cu128", torch_cuda="12.8")),  # CUDA minor
    (dict(torch="2.13.0"), dict(torch="2.13.0+cpu")),  # a local label alone
])
def test_what_is_compatible(built, now):
    base = dict(torch_cuda=None, cxx11_abi=True, python="3.11")
    assert _buildinfo.mismatches({**base, **built}, {**base, **now}) == []


def test_the_modules_own_record_compares_the_release_only():
    # _C.build_info (compiled in) has torch's x.y.z and the ABI flag, not the CUDA build: no CUDA rule
    own = dict(made_by=_buildinfo.MODULE, cxx11_abi=True)
    assert _buildinfo.mismatches({**own, "torch": "2.14.0"}, dict(NOW, torch="2.14.0.dev20260501+cu128", cxx11_abi=True)) == []
    assert _buildinfo.mismatches({**own, "torch": "2.13.0"}, dict(NOW, torch="2.14.0+cpu", cxx11_abi=True))


def test_the_message_names_both_builds_and_the_fixes():
    built = _rec(torch="2.12.0+cpu", torch_cuda=None)
    msg = _buildinfo.message(built, NOW, _buildinfo.mismatches(built, NOW), "REBUILD-CMD")
    assert f"built for torch 2.12.0+cpu (CPU, " in msg and f"but this is torch {NOW['torch']} (" in msg
    assert "`REBUILD-CMD`" in msg and "FASTCOLLATE_ALLOW_FALLBACK=1" in msg and "not loaded" in msg


def test_the_rebuild_command_fits_the_install(tmp_path):
    (tmp_path / "csrc").mkdir()
    (tmp_path / "setup.py").write_text("")
    (tmp_path / "fastcollate").mkdir()
    assert _ext.rebuild_command(str(tmp_path / "fastcollate")) == f"cd {tmp_path} && pip install --no-build-isolation -e ."
    site = tmp_path / "site-packages" / "fastcollate"
    site.mkdir(parents=True)
    assert _ext.rebuild_command(str(site)).startswith("pip install --no-build-isolation --no-deps --force-reinstall ")


# ---- this build ----------------------------------------------------------------------------------

def test_this_build_has_its_record_and_it_matches():
    assert _ext.BUILD is not None, f"no {_buildinfo.RECORD_NAME} beside the module in {PKG} (a build older than the record? rebuild)"
    assert _buildinfo.mismatches(_ext.BUILD, NOW) == []
    assert _ext.BUILD["cuda_kernels"] == fastcollate.cuda_kernels_built()
    info = _ext._C.build_info  # the module's own, from torch's headers: the record tells the truth
    assert _buildinfo.release(_ext.BUILD["torch"]).startswith(info["torch"]) and info["cxx11_abi"] == _ext.BUILD["cxx11_abi"]
    assert fastcollate._ext.built_for() == _buildinfo.describe(_ext.BUILD)


# ---- import from a copy whose record differs -------------------------------------------------------

def _run(tmp_path, pkg_root, code, **env):
    full_env = {k: v for k, v in os.environ.items() if k not in ("FASTCOLLATE_DISABLE", "FASTCOLLATE_ALLOW_FALLBACK")}
    full_env.update(PYTHONPATH=str(pkg_root), **env)
    prelude = f"import sys, warnings\nwarnings.simplefilter('always')\nROOT = {str(pkg_root)!r}\n"
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], cwd=tmp_path, env=full_env,
                          capture_output=True, text=True, timeout=120)




def test_a_mismatch_is_one_clear_importerror_before_loading(tmp_path):
    root = copy_package(tmp_path, record=OLDER, garbage_module=True)
    r = _run(tmp_path, root, """
        try:
            import fastcollate
        except ImportError as e:
            assert "fastcollate._C" not in sys.modules, "the module was loaded"
            print(e)
        else:
            raise AssertionError("imported: " + fastcollate.__file__)
    """)
    assert r.returncode == 0, r.stderr[-3000:]
    msg = r.stdout.strip()
    assert msg.startswith("fastcollate: the compiled engine was built for torch 2.12.0"), msg
    assert f"but this is torch {torch.__version__}" in msg and "the torch release differs (2.12.0 vs " in msg
    assert "pip install --no-build-isolation --no-deps --force-reinstall" in msg  # a copy outside a checkout
    assert "FASTCOLLATE_ALLOW_FALLBACK=1" in msg and "ELF" not in msg


def test_allow_fallback_runs_the_python_path_without_loading(tmp_path):
    root = copy_package(tmp_path, record=OLDER, garbage_module=True)
    r = _run(tmp_path, root, """
        with warnings.catch_warnings(record=True) as w:
            import fastcollate
        assert fastcollate.__file__.startswith(ROOT), fastcollate.__file__
        mine = [str(x.message) for x in w if "fastcollate" in str(x.message)]
        assert len(mine) == 1 and "torch release differs" in mine[0] and "FASTCOLLATE_ALLOW_FALLBACK is set" in mine[0], mine
        assert fastcollate.backend() == "python" and "fastcollate._C" not in sys.modules
        import torch
        from torch.utils.data import default_collate
        b = [{"x": torch.ones(2), "y": 1}, {"x": torch.zeros(2), "y": 2}]
        out, ref = fastcollate.collate(b), default_collate(b)
        assert torch.equal(out["x"], ref["x"]) and torch.equal(out["y"], ref["y"])
        try:
            fastcollate.Collator(backend="cpp")
        except RuntimeError as e:
            assert "torch release differs" in str(e), e
        else:
            raise AssertionError("backend='cpp' must refuse without the engine")
        print("ok")
    """, FASTCOLLATE_ALLOW_FALLBACK="1")
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


def test_the_disable_switch_still_rolls_back_on_a_mismatch(tmp_path):
    root = copy_package(tmp_path, record=_rec(cxx11_abi=not NOW["cxx11_abi"]), garbage_module=True)
    r = _run(tmp_path, root, """
        import fastcollate, torch
        from torch.utils.data import default_collate
        assert fastcollate.backend() == "python" and "fastcollate._C" not in sys.modules
        b = [(torch.ones(2), 1.5), (torch.zeros(2), 2.5)]
        out, ref = fastcollate.collate(b), default_collate(b)
        assert all(torch.equal(o, f) for o, f in zip(out, ref))
        assert fastcollate.stats()["disabled_batches"] == 1
        print("ok")
    """, FASTCOLLATE_DISABLE="1")
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]
    assert "C++11 ABI flag differs" in r.stderr and "FASTCOLLATE_DISABLE is set" in r.stderr


def test_no_record_is_tolerated_and_said(tmp_path):
    root = copy_package(tmp_path, drop_record=True)
    r = _run(tmp_path, root, """
        import fastcollate
        assert fastcollate.__file__.startswith(ROOT), fastcollate.__file__
        assert fastcollate.backend() == "cpp", fastcollate._ext.LOAD_ERROR
        assert fastcollate._ext.BUILD is None and fastcollate._ext.built_for().startswith("unknown")
        print("ok")
    """)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]
