"""Containers: a 64 MB /dev/shm is Docker's and Kubernetes' default, and torch's DataLoader dies
once the batches in flight outgrow it. fastcollate.DataLoader never uses /dev/shm: ring slots
and fallback arenas are memfds (and so are fastcollate.collate's arenas in torch's own workers).
Imitated with a private mount namespace and an 8 MB tmpfs on /dev/shm where `unshare -m` is
permitted (root); skipped with the reason elsewhere."""
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROBE = os.path.join(ROOT, "tests", "shm_probe.py")


def _container(which: str) -> subprocess.CompletedProcess:
    script = (f"mount -t tmpfs -o size=8m tmpfs /dev/shm && "
              f"exec {sys.executable} {PROBE} '{which}'")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=180,
                          env=env, cwd=ROOT)


def _can_unshare() -> str | None:
    if shutil.which("unshare") is None:
        return "no unshare(1)"
    r = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"], capture_output=True,
                       text=True)
    return None if r.returncode == 0 else f"unshare -m / mount not permitted here: {r.stderr.strip()[:120]}"


pytestmark = pytest.mark.skipif(_can_unshare() is not None, reason=str(_can_unshare()))


def test_torchs_loader_outgrows_a_small_dev_shm():
    r = _container("torch")
    assert r.returncode != 0 and "OK" not in r.stdout  # the failure the others must not have


@pytest.mark.parametrize("which", ["ring", "fallback", "torch+fastcollate.collate"])
def test_fastcollate_batches_never_need_dev_shm(which):
    r = _container(which)
    assert r.returncode == 0 and r.stdout.startswith("OK"), r.stdout + r.stderr[-2000:]
    if which == "fallback":
        assert r.stdout.split()[1:] == ["0", "4"]  # every batch took the fallback arena
