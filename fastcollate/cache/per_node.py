"""How the ranks of one node find one fastcollate.Cached: a registry file per cache, and memfds
opened through /proc.

Why this way. A cache is two memfds (fastcollate.core.shm): anonymous, so no other process can
open them by name, and no /dev/shm. A process that holds one exposes it as ``/proc/<pid>/fd/<n>``;
opening that path gives another process the same memory. It needs only what ptrace calls
PTRACE_MODE_READ -- same uid, the holder dumpable -- which Yama's ``ptrace_scope`` (1 on most
distributions) does not restrict, unlike ``pidfd_getfd`` (PTRACE_MODE_ATTACH). No rank serves
the others (no socket, no thread): any live holder hands the cache over without knowing it, so
the rank that made the cache may exit, and the cache lives while any holder does.

The registry. One small JSON file per cache, in ``FASTCOLLATE_NODE_DIR`` or
``<tempfile.gettempdir()>/fastcollate-<uid>`` (mode 0700, owned by this uid), named by a hash of
(uid, pid namespace, group, key), read and written under ``fcntl.flock`` of the file itself. It
records the key, the dataset's type and length, ``max_bytes`` (and whether it was given or the
default), the two memfds' (inode, device, size) and the holders: (pid, start time, ctrl fd, data
fd) of each rank that mapped it. A process joins under the lock: holders whose pid is gone or
belongs to a process started at another time are pruned; from a live one it stats and opens
``/proc/<pid>/fd/<n>`` and maps it only if the inode, the device and the size are the
registry's -- a pid the kernel gave to another process, holding another file at that number, is
never trusted. With no live holder the cache is gone (its memory freed with its last holder):
the process makes a new one and overwrites the record. A process takes its holder line out
when its cache is collected or it exits (the last one out removes the file); one that is killed
leaves a dead pid, pruned by the next process to look.

Restarts. A rank that exits or is killed takes nothing from the others, and a rank that starts
again joins the cache they hold. torchrun's elastic agent, though, restarts the whole worker group
when any rank fails: every holder exits at once. So where the agent may restart the ranks
(``TORCHELASTIC_MAX_RESTARTS`` > 0) the rank that makes the cache also starts a keeper: a bare
interpreter holding the two memfds, in a session of its own, that ends when the agent (the
rank's parent) ends. The restarted ranks open the cache from the keeper.

Identity. The group is ``group=``, else ``FASTCOLLATE_CACHE_GROUP``, else the job: torchrun's
``TORCHELASTIC_RUN_ID`` (unless it is ``none``, torchrun's default for a static multi-node
rendezvous), else ``MASTER_ADDR:MASTER_PORT``, else SLURM's job and step ids. The key is
``name=``, else the dataset's type (module.qualname) and how many node-wide Cached of that type
this process made before it: ranks run the same code, so a train set made first and a
validation set made second line up on every rank. A key found with another dataset type, length
or explicitly given max_bytes is refused (one error that names both and says ``name=``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import tempfile
import threading
import weakref
from typing import Any, Callable, Iterator

import torch

from ..core.launcher import int_env, local_ranks
from ..core.shm import map_fd, pid_alive, process_start, segment_fd
from .identity import Fingerprint, fingerprint

__all__ = ["NodeCache", "Unreachable", "group_for", "key_for", "open_node", "registry_dir", "local_world_size"]

logger = logging.getLogger("fastcollate")
ENV_DIR = "FASTCOLLATE_NODE_DIR"
ENV_GROUP = "FASTCOLLATE_CACHE_GROUP"
VERSION = 1
_ORDINALS: dict[str, int] = {}
_ordinal_lock = threading.Lock()
_warned: set[str] = set()


class Unreachable(RuntimeError):
    """The node's cache has live holders, but none could be opened from here (the message says why)."""


def local_world_size() -> int:
    """Ranks on this node as the launcher says: ``LOCAL_WORLD_SIZE`` (torchrun), else
    ``SLURM_NTASKS_PER_NODE``; 1 outside a launcher (fastcollate.tuning.node reads the same)."""
    return local_ranks()[0]


def job_id() -> str | None:
    """What names this job on this node, from the launcher's environment; None outside one."""
    run = os.environ.get("TORCHELASTIC_RUN_ID", "").strip()
    if run and run != "none":  # "none": torchrun's default id, the same for every static-rendezvous job
        return f"torchelastic:{run}"
    port = os.environ.get("MASTER_PORT", "").strip()
    if port:
        return f"master:{os.environ.get('MASTER_ADDR', '').strip()}:{port}"
    slurm = os.environ.get("SLURM_JOB_ID", "").strip()
    if slurm:
        return f"slurm:{slurm}.{os.environ.get('SLURM_STEP_ID', '').strip()}"
    return None


def group_for(node: bool | None, group: str | None) -> str | None:
    """The group a new Cached shares its cache in, or None for a private cache."""
    if node is False:
        if group is not None:
            raise ValueError(f"fastcollate.Cached: group={group!r} names the ranks a node-wide cache is shared "
                             "with, and node=False keeps this cache private; pass one or the other")
        return None
    if group is None:
        group = os.environ.get(ENV_GROUP, "").strip() or None
    if group is not None:
        return f"group:{group}"
    ranks = local_world_size()
    if node is None and ranks <= 1:
        return None
    job = job_id()
    if job is not None:
        return job
    say = ("nothing in the environment names the job to share it in (TORCHELASTIC_RUN_ID, MASTER_ADDR/"
           "MASTER_PORT, SLURM_JOB_ID); pass group='...' (the same on every rank of the job) or set "
           f"{ENV_GROUP}")
    if node:
        raise ValueError(f"fastcollate.Cached: node=True, but {say}")
    if "no job" not in _warned:
        _warned.add("no job")
        logger.warning("fastcollate.Cached: the launcher says %d ranks share this node, but %s; each rank "
                       "keeps a private cache", ranks, say)
    return None


def type_name(dataset: Any) -> str:
    return f"{type(dataset).__module__}.{type(dataset).__qualname__}"


def key_for(dataset: Any, name: str | None) -> str:
    """``name``, else the dataset's type and its ordinal among this process's node-wide caches."""
    if name is not None:
        return f"name:{name}"
    kind = type_name(dataset)
    with _ordinal_lock:
        n = _ORDINALS[kind] = _ORDINALS.get(kind, -1) + 1
    return f"{kind}#{n}"


def registry_dir() -> str:
    """The directory of this uid's registries, made 0700 where it is ours to make."""
    uid = os.getuid()
    given = os.environ.get(ENV_DIR, "").strip()
    path = given or os.path.join(tempfile.gettempdir(), f"fastcollate-{uid}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.stat(path)
    if st.st_uid != uid:
        raise PermissionError(f"fastcollate.Cached: the node cache's registry directory {path} belongs to uid "
                              f"{st.st_uid}, not to this process's uid {uid}; set {ENV_DIR} to a directory of yours")
    if not given and st.st_mode & 0o077:  # ours, made wider by someone's umask or chmod: only we read it
        os.chmod(path, 0o700)
    return path


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:  # pragma: no cover - no /proc: every pid is in one namespace as far as we can tell
        return 0


def registry_path(group: str, key: str, given: str | None = None) -> str:
    # the pid namespace is in the name: the registry's pids, and the claims in the cache, mean
    # nothing in another one (a container with its own /proc sharing this /tmp); a key= the user
    # gave is too: different keys are different caches
    ident = "\0".join([str(os.getuid()), str(_pid_namespace()), group, key] + ([] if given is None else [given]))
    return os.path.join(registry_dir(), f"cache-{hashlib.sha256(ident.encode()).hexdigest()[:32]}.json")


@contextlib.contextmanager
def _locked(path: str, block: bool = True, create: bool = True) -> Iterator[int | None]:
    """The registry file, open and exclusively flock'ed (None when ``block`` is False and another
    process holds it; FileNotFoundError when it does not exist and ``create`` is False). The file
    is its own lock; a waiter whose file the last holder unlinked meanwhile starts over on the
    new one."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0), 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            yield None
            return
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        yield fd
    finally:
        os.close(fd)  # releases the lock


def _read(fd: int) -> dict[str, Any] | None:
    text = os.pread(fd, 1 << 20, 0).decode(errors="replace")
    if not text.strip():
        return None
    try:  # raw_decode: a writer killed between its write and its truncate leaves a tail, never a torn head
        rec, _ = json.JSONDecoder().raw_decode(text)
    except ValueError:
        return None
    return rec if isinstance(rec, dict) and rec.get("version") == VERSION else None


def _write(fd: int, rec: dict[str, Any]) -> None:
    data = json.dumps(rec).encode()
    os.pwrite(fd, data, 0)
    os.ftruncate(fd, len(data))


def _alive(holder: list[int]) -> bool:
    pid, start = holder[0], holder[1]
    return pid_alive(pid) and process_start(pid) == start


# The keeper: a process that holds a cache's memfds while torchelastic restarts the ranks. The
# elastic agent restarts the whole worker group on any failure, so without it every holder of the
# node's cache exits at once and the restarted ranks refill it from the dataset. It is the
# interpreter alone (-I -S: no site, no torch, a few MB), in a session of its own (the agent
# kills each rank's process group), and it ends when the agent it watches does -- when the job
# ends, however it ends.
_KEEPER = """
import fcntl, json, os, sys, time
anchor, start, registry = sys.argv[1], sys.argv[2], os.environ["FASTCOLLATE_KEEPER_REGISTRY"]
def started(pid):
    try:
        with open("/proc/" + str(pid) + "/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else fields[19]
while started(anchor) == start:
    time.sleep(1.0)
# the job is over: where no rank holds the cache any more, its registry goes with this keeper
try:
    fd = os.open(registry, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    if os.fstat(fd).st_ino == os.stat(registry).st_ino:
        rec = json.JSONDecoder().raw_decode(os.pread(fd, 1 << 20, 0).decode())[0]
        mine = (rec.get("keeper") or [None])[0] == os.getpid()
        if mine and not any(started(h[0]) == str(h[1]) for h in rec.get("holders", [])):
            os.unlink(registry)
except (OSError, ValueError, IndexError, TypeError, AttributeError):
    pass
"""
_KEEPERS: list[Any] = []  # this process's keepers' Popen objects: never collected (and never waited for)


def keeper_anchor() -> int | None:
    """The torchelastic agent to keep a cache alive for: this rank's parent, where torchrun may
    restart the ranks (``TORCHELASTIC_MAX_RESTARTS`` > 0); None otherwise."""
    if not os.environ.get("TORCHELASTIC_RUN_ID") or (int_env("TORCHELASTIC_MAX_RESTARTS") or 0) <= 0:
        return None
    parent = os.getppid()
    return parent if parent > 1 else None


def _start_keeper(anchor: int, fds: tuple[int, int], registry: str) -> list[int] | None:
    """Starts a keeper holding ``fds`` (at the same numbers) until ``anchor`` ends, then removing
    ``registry`` if no rank holds the cache: its holder line."""
    import subprocess
    import sys

    start = process_start(anchor)
    if start is None:
        return None
    try:
        proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _KEEPER, str(anchor), str(start)], pass_fds=fds,
                                env=dict(os.environ, FASTCOLLATE_KEEPER_REGISTRY=registry),
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
    except OSError as exc:
        logger.warning("fastcollate.Cached: could not start the process that keeps the node's cache across "
                       "torchelastic restarts (%s); a restart refills it", exc)
        return None
    _KEEPERS.append(proc)
    return [proc.pid, process_start(proc.pid), *fds]


class _Stale(Exception):
    """A holder that no longer holds the cache: its fd is closed, or is another file now."""


def _open_from(rec: dict[str, Any], holder: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The cache's (ctrl, data) mapped here from a holder's descriptors; _Stale where the holder
    has not got them, OSError (EACCES, EPERM) where its /proc entries are not ours to open."""
    pid, _, *fds = holder
    out = []
    for fd_no, part, dtype in zip(fds, ("ctrl", "data"), (torch.int64, torch.uint8)):
        ino, dev, nbytes = rec[part]
        link = f"/proc/{pid}/fd/{fd_no}"
        try:  # stat first: a stranger's file at that number is never even opened
            st = os.stat(link)
        except FileNotFoundError as exc:
            raise _Stale(f"pid {pid} has no fd {fd_no}") from exc
        if (st.st_ino, st.st_dev, st.st_size) != (ino, dev, nbytes):
            raise _Stale(f"pid {pid}'s fd {fd_no} is another file")
        try:
            fd = os.open(link, os.O_RDWR | os.O_CLOEXEC | os.O_NOCTTY)
        except FileNotFoundError as exc:
            raise _Stale(f"pid {pid} closed fd {fd_no}") from exc
        try:
            st = os.fstat(fd)  # again on what was opened: the holder may have exited in between
            if (st.st_ino, st.st_dev, st.st_size) != (ino, dev, nbytes):
                raise _Stale(f"pid {pid}'s fd {fd_no} is another file")
            out.append(map_fd(fd, nbytes, dtype))
        finally:
            os.close(fd)
    return out[0], out[1]


def _mismatch(rec: dict[str, Any], key: str, kind: str, entries: int, max_bytes: int | None) -> str | None:
    differ = []
    if rec["dataset"] != kind:
        differ.append("type")
    if rec["entries"] != entries:
        differ.append("length")
    if max_bytes is not None and rec["max_bytes"] != max_bytes:
        differ.append("max_bytes")
    if not differ:
        return None
    mine = f"{kind} of {entries} samples, max_bytes={max_bytes if max_bytes is not None else 'default'}"
    made = rec.get("made_by", {})
    theirs = (f"{rec['dataset']} of {rec['entries']} samples, max_bytes={rec['max_bytes']} "
              f"({'given' if rec.get('max_bytes_given') else 'the default'}), made by pid {made.get('pid')}"
              f"{'' if made.get('local_rank') is None else ', local rank ' + str(made['local_rank'])}")
    name = key[5:] if key.startswith("name:") else None
    how = (f"both were made with name={name!r}" if name is not None else
           f"neither has a name=, so each is keyed by its type and how many node-wide Cached of that type the "
           f"process made before it ({key}): the ranks made their caches in different orders, or wrapped different "
           "datasets")
    return (f"fastcollate.Cached: this dataset ({mine}) is not the one the node's cache under its key holds "
            f"({theirs}); they differ in {' and '.join(differ)}. {how[0].upper() + how[1:]}. Give each dataset its "
            "own name=, the same on every rank -- Cached(train, name='train'), Cached(val, name='val') -- or "
            "node=False to keep one private")


def _not_the_same(rec: dict[str, Any], key: str, identity: Fingerprint) -> str | None:
    """Why this dataset is not the one the cache holds, though type and length match; None when
    their fingerprints agree."""
    if rec.get("fingerprint") is None:
        theirs = None
    else:
        theirs = Fingerprint.from_record(rec["fingerprint"])
        if theirs.digest == identity.digest:
            return None
    made = rec.get("made_by", {})
    who = (f"pid {made.get('pid')}" + ("" if made.get("local_rank") is None else f", local rank {made['local_rank']}"))
    if theirs is None:
        differ = "the cache was made by a fastcollate that records no fingerprint"
    else:
        parts = identity.differing(theirs)
        differ = (f"fingerprint {identity.digest[:12]} here, {theirs.digest[:12]} in the cache made by {who}; they "
                  f"differ in {', '.join(parts[:6])}{' ...' if len(parts) > 6 else ''}")
    return (f"fastcollate.Cached: this dataset is not the one the node's cache under {key!r} holds: the same type "
            f"({rec['dataset']}) and length ({rec['entries']}), but not the same content ({differ}). Sharing it "
            "would serve this rank another dataset's samples. If the ranks wrap different data (a per-rank shard, "
            "another split, another seed), give each its own key -- Cached(ds, key=f'shard-{rank}') -- or "
            "node=False to keep each private; if it is the same data and only harmless state differs (a counter, "
            "the rank's id), pass the same key='...' on every rank")


def _holders_and_keeper(rec: dict[str, Any]) -> list[list[int]]:
    return list(rec.get("holders", [])) + ([rec["keeper"]] if rec.get("keeper") else [])


def _prune(directory: str, keep: str) -> None:
    """Removes the registries of caches no process holds any more (a job whose last rank was
    killed), skipping any another process has locked."""
    for entry in os.listdir(directory):
        path = os.path.join(directory, entry)
        if path == keep or not (entry.startswith("cache-") and entry.endswith(".json")):
            continue
        try:
            with _locked(path, block=False, create=False) as fd:
                if fd is None:
                    continue
                rec = _read(fd)
                if rec is None or not any(_alive(h) for h in _holders_and_keeper(rec)):
                    os.unlink(path)
        except OSError:  # gone meanwhile, or not ours: not this process's to tidy
            continue


@dataclasses.dataclass
class NodeCache:
    """What a process knows of the node-wide cache it holds (pickled into spawn workers with the
    wrapper): its group, key, registry, and whether this process made it."""

    group: str
    key: str
    path: str
    made: bool
    check: bool = False
    fingerprint: Fingerprint | None = None
    _leave: Any = dataclasses.field(default=None, repr=False, compare=False)

    def leave(self) -> None:
        """Lets the cache go now (its holder line out of the registry), as collecting it would."""
        if self._leave is not None:
            self._leave()

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_leave"}  # the finalizer is this process's

    def holders(self) -> int:
        """The live processes holding the cache now, by the registry (each a rank, its DataLoader
        workers not counted)."""
        try:
            with _locked(self.path, create=False) as fd:
                rec = _read(fd)
        except OSError:  # no registry: its last holder left
            return 0
        if rec is None:
            return 0
        return len({h[0] for h in rec.get("holders", []) if _alive(h)})


def _leave(path: str, holder: list[int]) -> None:
    """Takes this process's holder line out of the registry (the cache was collected, or the
    process exits); the last one out removes the file."""
    if holder[0] != os.getpid():  # a forked child inherited the finalizer: the line is its parent's
        return
    try:
        with _locked(path, create=False) as fd:
            rec = _read(fd)
            if rec is None:  # unreadable: nobody can join through it anyway
                os.unlink(path)
                return
            rec["holders"] = [h for h in rec.get("holders", []) if h != holder and _alive(h)]
            if rec["holders"] or (rec.get("keeper") and _alive(rec["keeper"])):
                _write(fd, rec)
            else:
                os.unlink(path)
    except OSError:  # no registry, or no directory (a test's temporary one): nothing to leave
        pass


def open_node(group: str, key: str, dataset: Any, entries: int, max_bytes: int | None,
              default_max_bytes: Callable[[], int],
              make: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
              identity: Fingerprint | None = None) -> tuple[torch.Tensor, torch.Tensor, int, NodeCache]:
    """Joins the node's cache under (group, key), or makes it: (ctrl, data, max_bytes, handle).

    ``max_bytes`` None: the cache's own, or ``default_max_bytes()`` computed here when this
    process makes it. ``make(max_bytes)`` makes new, initialized segments (called with the
    registry locked, so one process of the node makes the cache). ``identity``: the dataset's
    fingerprint (fastcollate.cache.identity; computed here when None); a user-given key in
    it is part of the cache's name. Raises ValueError when the key holds another dataset (another
    type, length, max_bytes or fingerprint), Unreachable when live holders cannot be opened from
    here. ``handle.check``: the fingerprints could only sample, so the caller should spot-check
    the samples already cached (and ``handle.leave()`` on a mismatch)."""
    kind = type_name(dataset)
    identity = fingerprint(dataset) if identity is None else identity
    path = registry_path(group, key, identity.key)
    pid = os.getpid()
    with _locked(path) as fd:
        rec = _read(fd)
        mapped = None
        refused: list[str] = []
        if rec is not None and rec.get("group") == group and rec.get("key") == key:
            live = [h for h in rec.get("holders", []) if _alive(h)]
            keeper = rec.get("keeper") if rec.get("keeper") and _alive(rec["keeper"]) else None
            for h in live + ([keeper] if keeper else []):
                try:
                    mapped = _open_from(rec, h)
                    break
                except _Stale:
                    if h is keeper:
                        keeper = None
                    else:
                        live.remove(h)
                except OSError as exc:
                    refused.append(f"pid {h[0]}: {exc.strerror or exc}")
            rec["holders"], rec["keeper"] = live, keeper
            if mapped is not None:
                said = _mismatch(rec, key, kind, entries, max_bytes) or _not_the_same(rec, key, identity)
                if said is not None:
                    raise ValueError(said)
                theirs = rec["fingerprint"]
            elif live or keeper:
                raise Unreachable(f"the node's cache under {key!r} is held by {len(live) + bool(keeper)} live "
                                  f"process(es), none of which this one may open through /proc ({'; '.join(refused)})")
        made = mapped is None
        check = not made and identity.key is None and not (identity.complete and theirs.get("complete"))
        if made:
            size = default_max_bytes() if max_bytes is None else max_bytes
            ctrl, data = make(size)
            rec = {"version": VERSION, "group": group, "key": key, "dataset": kind, "entries": entries,
                   "max_bytes": size, "max_bytes_given": max_bytes is not None,
                   "made_by": {"pid": pid, "local_rank": int_env("LOCAL_RANK")}, "holders": [],
                   "fingerprint": identity.record()}
            for part, seg in (("ctrl", ctrl), ("data", data)):
                st = os.fstat(segment_fd(seg)[0])
                rec[part] = [st.st_ino, st.st_dev, st.st_size]
            anchor = keeper_anchor()
            fds = (segment_fd(ctrl)[0], segment_fd(data)[0])
            rec["keeper"] = None if anchor is None else _start_keeper(anchor, fds, path)
        else:
            ctrl, data = mapped
        holder = [pid, process_start(pid), segment_fd(ctrl)[0], segment_fd(data)[0]]
        rec["holders"].append(holder)
        _write(fd, rec)
    _prune(os.path.dirname(path), path)  # every attach tidies what dead jobs left
    handle = NodeCache(group=group, key=key, path=path, made=made, check=check, fingerprint=identity)
    handle._leave = weakref.finalize(handle, _leave, path, holder)
    return ctrl, data, int(rec["max_bytes"]), handle

