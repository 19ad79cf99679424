"""How much memory fastcollate.Cached may take by default: what the process can still use, from the
kernel (/proc/meminfo's MemAvailable) and from its memory cgroup's limit (containers, pods).

A cgroup's usage (v2 ``memory.current``, v1 ``memory.usage_in_bytes``) counts the page cache: a
16 GiB pod that has read 14 GiB of files shows 14 GiB used although the kernel gives those pages
back on demand. The reclaimable file pages -- ``active_file`` + ``inactive_file`` in v2's
``memory.stat``, ``total_active_file`` + ``total_inactive_file`` in v1's (the unprefixed ones
where the totals are absent) -- are taken off the usage. Shared memory (shmem: a cache's own
segments, /dev/shm) is not on those lists: it stays counted as used.
"""
from __future__ import annotations

import os

__all__ = ["default_max_bytes", "memory_available", "DEFAULT_FRACTION"]

DEFAULT_FRACTION = 0.5  # of the memory available when the cache is made
UNLIMITED = 1 << 60  # a cgroup limit at or above this is no limit (v1 writes 2**63 - 4096)
# where the cgroup hierarchy and this process's place in it are read (a test points them at a fake tree)
CGROUP_ROOT = "/sys/fs/cgroup"
PROC_SELF_CGROUP = "/proc/self/cgroup"


def _read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _read_int(path: str) -> int | None:
    text = _read_text(path)
    if text is None:
        return None
    text = text.strip()
    if text == "max":
        return UNLIMITED
    try:
        return int(text)
    except ValueError:
        return None


def _read_stat(path: str) -> dict[str, int]:
    """A ``memory.stat`` file as {key: value}; empty when it cannot be read."""
    out: dict[str, int] = {}
    for line in (_read_text(path) or "").splitlines():
        key, _, value = line.partition(" ")
        try:
            out[key] = int(value)
        except ValueError:
            continue
    return out


def _file_pages(stat_path: str) -> int:
    """Bytes of reclaimable page cache a cgroup's usage includes (0 when memory.stat says nothing)."""
    stat = _read_stat(stat_path)
    prefix = "total_" if "total_active_file" in stat or "total_inactive_file" in stat else ""
    return stat.get(f"{prefix}active_file", 0) + stat.get(f"{prefix}inactive_file", 0)


def _cgroup_dirs() -> list[str]:
    """The memory cgroup directories that may bound this process: the hierarchy's root (inside a
    cgroup namespace, the container's own group), and the process's group where it is visible."""
    dirs = [CGROUP_ROOT, f"{CGROUP_ROOT}/memory"]
    for line in (_read_text(PROC_SELF_CGROUP) or "").splitlines():
        try:
            _, controllers, path = line.split(":", 2)
        except ValueError:
            continue
        if path in ("", "/"):
            continue
        if controllers == "":  # v2: one unified hierarchy
            dirs.append(f"{CGROUP_ROOT}{path}")
        elif "memory" in controllers.split(","):
            dirs.append(f"{CGROUP_ROOT}/memory{path}")
    return dirs


def _cgroup_room() -> int | None:
    """What the memory cgroup's limit leaves (limit - usage + reclaimable page cache), where a
    limit is set; the smallest over the groups found."""
    room = None
    for d in _cgroup_dirs():
        for limit_name, usage_name in (("memory.max", "memory.current"),  # v2
                                       ("memory.limit_in_bytes", "memory.usage_in_bytes")):  # v1
            limit, usage = _read_int(f"{d}/{limit_name}"), _read_int(f"{d}/{usage_name}")
            if limit is None or usage is None or limit >= UNLIMITED:
                continue
            used = max(0, usage - _file_pages(f"{d}/memory.stat"))
            left = max(0, limit - used)
            room = left if room is None else min(room, left)
    return room


def memory_available() -> int:
    """Bytes of memory this process can still use: the smaller of /proc/meminfo's MemAvailable and
    what the memory cgroup's limit leaves (containers), where either is known. The cgroup's
    usage is taken without its reclaimable page cache (the module's docstring says which pages)."""
    avail = None
    for line in (_read_text("/proc/meminfo") or "").splitlines():
        if line.startswith("MemAvailable:"):
            avail = int(line.split()[1]) * 1024
            break
    room = _cgroup_room()
    known = [v for v in (avail, room) if v is not None]
    if not known:  # pragma: no cover - not Linux
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))
    return min(known)


def default_max_bytes() -> int:
    """Cached's default ``max_bytes``: ``DEFAULT_FRACTION`` (half) of :func:`memory_available`."""
    return int(memory_available() * DEFAULT_FRACTION) // 64 * 64
