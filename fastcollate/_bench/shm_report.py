"""`fastcollate doctor`'s environment report: how much /dev/shm there is and whether the loaders
need it. (The doctor itself is fastcollate.doctor.diagnose.)"""
from __future__ import annotations

import os


def shm_line(workers: int) -> str:
    """How much /dev/shm there is, and whether the loaders will need it."""
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return "/dev/shm: none (torch's DataLoader workers cannot send batches; fastcollate.DataLoader's ring can)"
    total, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    need = ("torch's DataLoader puts every worker batch there; fastcollate's worker batches never do (memfds)"
            if workers > 0 else "no workers: neither loader needs it")
    small = "  (small: a container default; pass --shm-size or use fastcollate.DataLoader)" if total < 1 << 30 else ""
    return f"{free / 2**30:.2f} GiB free of {total / 2**30:.2f} GiB; {need}{small}"
