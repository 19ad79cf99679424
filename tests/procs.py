"""The processes a launched test run left behind, found by a token in their command line."""
from __future__ import annotations

import os


def processes_with(token: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if token.encode() in f.read():
                        found.append(int(pid))
            except OSError:  # gone between the listing and the read
                pass
    return found
