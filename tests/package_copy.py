"""A temp copy of the installed package whose build record or compiled module is altered: how the
tests meet a build for another torch, or a module that does not load, with only one torch here."""
from __future__ import annotations

import json
import os
import shutil

import fastcollate
from fastcollate import _buildinfo

PKG = os.path.dirname(os.path.abspath(fastcollate.__file__))
NOW = _buildinfo.running()
# the record of a build for the previous torch release (same CPU/CUDA kind)
OLDER = {**NOW, "torch": "2.12.0+cpu" if NOW["torch_cuda"] is None else f"2.12.0+cu{NOW['torch_cuda'].replace('.', '')}"}


def copy_package(tmp_path, record=None, drop_record=False, garbage_module=False):
    """The copy's root (put it first on PYTHONPATH): ``record`` replaces the build record,
    ``drop_record`` removes it, ``garbage_module`` makes the compiled module fail to load."""
    dst = tmp_path / "pkg" / "fastcollate"
    shutil.copytree(PKG, dst, ignore=shutil.ignore_patterns("__pycache__"))
    if drop_record:
        os.remove(dst / _buildinfo.RECORD_NAME)
    if record is not None:
        (dst / _buildinfo.RECORD_NAME).write_text(json.dumps(record))
    if garbage_module:  # loading it would fail with "invalid ELF header", not with our message
        for name in os.listdir(dst):
            if name.startswith("_C.") and name.endswith(".so"):
                (dst / name).write_bytes(b"not a shared object")
    return dst.parent
