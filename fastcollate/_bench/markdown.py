"""`fastcollate bench --markdown PATH`: the collate table as a Markdown file that names what made
it -- the command, the machine, torch, the engine -- so a table kept in the repository (the docs'
benchmark pages) never loses its provenance."""
from __future__ import annotations

import datetime
import os
import platform
import shlex
import sys
from typing import Any, Sequence

import torch

from . import collate_bench, noise


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / 2**20
    except (OSError, ValueError, IndexError):
        pass
    return None


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def machine() -> dict[str, Any]:
    """What a reader needs to compare a table with their own machine."""
    mem = _memory_gib()
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {
        "cpu": _cpu_model(),
        "usable_cores": _usable_cores(),
        "online_cores": os.cpu_count(),
        "memory_gib": round(mem, 1) if mem is not None else None,
        "os": f"{platform.system()} {platform.release()} {platform.machine()}",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "gpu": gpu,
        "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


def command(argv: Sequence[str]) -> str:
    """The command line as a reader would type it again."""
    return "fastcollate " + " ".join(shlex.quote(a) for a in argv)


BUSY = "On a busy machine, every row is flagged."


def _load_line(m: dict[str, Any], loads: Sequence[float | None] | None) -> str:
    """The load while the table was measured (start and end), or when it was written."""
    if loads is not None:
        start, end = loads
        line = noise.load_line(start, end, (m["usable_cores"], m["online_cores"] or m["usable_cores"]))
        return f"- {line}, while the table\n  was measured. {BUSY}\n"
    if m["load_average"] is None:
        return ""
    busy = " (above the core count: other processes shared the machine)" if m["load_average"] > m["usable_cores"] else ""
    return f"- load average (1 min) when the table was written: {m['load_average']:.2f} on {m['usable_cores']} cores{busy}\n"


def collate_markdown(rows: list[dict[str, Any]], argv: Sequence[str], *, backend: str, quick: bool,
                     rounds: int, min_time: float, loads: Sequence[float | None] | None = None) -> str:
    m = machine()
    mem = f", {m['memory_gib']} GiB memory" if m["memory_gib"] is not None else ""
    lines = [
        "# Collate: fastcollate vs default_collate",
        "",
        f"Made by `{command(argv)}` on {datetime.date.today().isoformat()}.",
        "",
        f"- machine: {m['cpu']}, {m['usable_cores']} usable cores of {m['online_cores']}{mem}; {m['os']}",
        f"- software: Python {m['python']}, torch {m['torch']}"
        + (f" (CUDA {m['torch_cuda']})" if m["torch_cuda"] else " (CPU build)")
        + f", fastcollate engine: {backend}" + (f"; GPU: {m['gpu']}" if m["gpu"] else ""),
        _load_line(m, loads) + f"- timing: medians of {rounds} interleaved rounds, each at least {min_time:g} s of calls. "
        "The previous batch is\n  held alive, as a training loop holds it.",
    ]
    if quick:
        lines.append("- **a quick run** (`--quick`: 2 short rounds): a smoke run's figures, noisier than a full run's")
    lines += [
        "",
        "The columns:",
        "",
        "- *speedup* = default_collate's time / fastcollate's, measured side by side in each round.",
        "- *of memcpy* = a `Tensor.copy_` of the same bytes into a reused buffer / fastcollate's time.",
        "  This is the ceiling for large batches. From 8 MB, fastcollate writes with streaming stores,",
        "  which skip reading each destination line first. So it may reach 150% of the ceiling. \"—\" marks",
        "  a batch below 1 MB, where the cost is per leaf, not per byte.",
        "- Each figure is the median over rounds, with its min-max over rounds in brackets.",
        f"- *noise* marks ({noise.MARK}) a row whose figures cannot be trusted. The reasons are below the table.",
        "",
        collate_bench.format_table(rows),
        "",
    ]
    warn = noise.warning_lines(rows, lambda r: r["description"], rounds, noise.advice(quick))
    if warn:
        lines += ["```text", *warn, "```", ""]
    return "\n".join(lines)


def write_collate(path: str, rows: list[dict[str, Any]], argv: Sequence[str] | None = None, **kw: Any) -> str:
    text = collate_markdown(rows, sys.argv[1:] if argv is None else argv, **kw)
    with open(path, "w") as f:
        f.write(text)
    return path


def append_table(path: str, title: str, intro: str, table: str, warn: Sequence[str] = (),
                 loads: Sequence[float | None] | None = None) -> str:
    """One more table of the same run under the collate table (same machine, same command): its
    title, what it measures (``intro``, as it goes on the page), the table as the bench printed it,
    its noise lines and its load."""
    m = machine()
    lines = ["", f"## {title}", "", intro.strip()]
    if loads is not None:
        start, end = loads
        line = noise.load_line(start, end, (m["usable_cores"], m["online_cores"] or m["usable_cores"]))
        lines += ["", f"{line[:1].upper()}{line[1:]}, while the table was\nmeasured. {BUSY}"]
    lines += ["", table, ""]
    if warn:
        lines += ["```text", *warn, "```", ""]
    with open(path, "a") as f:
        f.write("\n".join(lines))
    return path
