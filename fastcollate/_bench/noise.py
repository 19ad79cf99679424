"""Whether a bench row's numbers can be trusted: each ratio's spread over rounds, and the rules
that flag a row as noise. Pure functions of the rounds' figures (no timing here), so the rules
are tested on made-up rounds.

A ratio is measured once per round (both sides timed in the same round, interleaved); the row
prints the median of those per-round ratios and their min-max. A row is flagged when:

- ``straddles_1``: its rounds disagree on which side of 1 the ratio is (one round faster, another
  slower): which of the two is faster is not known;
- ``not_separable``: the spread (max - min) of the ratio is wider than its distance from 1
  (|median - 1|): the two sides cannot be told apart at this noise level;
- ``one_round``: a single round: its spread is unknown;
- ``impossible``: a figure no machine can reach, e.g. fastcollate at more than 130% of the memcpy
  ceiling measured beside it -- the ceiling's own timing was disturbed. The ceiling is a copy
  with ordinary stores, which read every destination line in before writing it (three memory
  transfers a byte); fastcollate writes a large main-process batch (8 MB and more, on x86) with
  streaming stores, which skip that read (two transfers), so up to 150% of the copy is physical
  there (measured: 137-145% with streaming, 79-93% with FASTCOLLATE_STREAM_BYTES=0 on the same
  77 MB batch), and the limit is STREAMED_CEILING_LIMIT;
- ``busy``: the machine's load average (1 min) while the table ran, less what the bench itself
  runs (its main process and its workers), exceeded the cores (the load average counts the whole
  machine, so it is compared with the online cores; they are the usable cores unless the process
  is pinned to a subset).

A flagged row still prints its figures, with a mark, and the table is followed by the reasons.
"""
from __future__ import annotations

import os
import statistics
from typing import Any, Callable, Iterable, Mapping, Sequence

CEILING_LIMIT = 1.30  # above 100% of a copy ceiling by more than timing jitter: the ceiling was disturbed
STREAMED_CEILING_LIMIT = 1.5 * CEILING_LIMIT  # streaming stores save one transfer of three: up to 1.5x
MARK = "!"
ADVICE = ("these figures are noise, not measurements: rerun with more --rounds (e.g. --rounds 9) on an "
          "idle machine")
QUICK_ADVICE = ("these figures are noise, not measurements: rerun without --quick (it takes 2 short rounds), "
                "with more --rounds (e.g. --rounds 9), on an idle machine")


def advice(quick: bool = False) -> str:
    return QUICK_ADVICE if quick else ADVICE


def load_now() -> float | None:
    """The 1-minute load average, or None where the platform has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # pragma: no cover - not Unix
        return None


def cores() -> tuple[int, int]:
    """(usable cores: this process's affinity, online cores of the machine)."""
    online = os.cpu_count() or 1
    try:
        return len(os.sched_getaffinity(0)), online
    except AttributeError:  # pragma: no cover - not Linux
        return online, online


def spread(values: Sequence[float], judge: str | None = "ratio") -> dict[str, Any]:
    """A figure over rounds: its median, min, max and every round's value. ``judge`` says which
    rules apply: "ratio" (compared with 1), "ceiling" (a fraction of a physical ceiling),
    "streamed_ceiling" (the same, for a copy made with streaming stores), None."""
    vals = [float(v) for v in values]
    if not vals:
        raise ValueError("a spread needs at least one round")
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "rounds": vals,
            "judge": judge}


def ratio_rounds(num: Sequence[float], den: Sequence[float]) -> list[float]:
    """Per-round ratios num[i] / den[i] of two figures measured side by side in each round."""
    if len(num) != len(den):
        raise ValueError(f"{len(num)} rounds against {len(den)}")
    return [a / b if b > 0 else float("inf") for a, b in zip(num, den)]


def ratio_reasons(s: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The rules on a ratio compared with 1: [(rule, why)], empty when the ratio is trusted."""
    lo, hi, med = s["min"], s["max"], s["median"]
    if len(s["rounds"]) < 2:
        return [("one_round", f"{med:.2f}x from a single round: its spread is unknown")]
    if lo < 1 < hi:
        return [("straddles_1", f"rounds disagree on which side of 1 it is ({lo:.2f}x-{hi:.2f}x)")]
    if hi - lo > abs(med - 1):
        return [("not_separable", f"its spread ({lo:.2f}x-{hi:.2f}x, {hi - lo:.2f} wide) is wider than its "
                                  f"distance from 1 ({med:.2f}x)")]
    return []


def ceiling_reasons(s: Mapping[str, Any], limit: float = CEILING_LIMIT) -> list[tuple[str, str]]:
    """The rule on a fraction of a physical ceiling: far above 100% is impossible."""
    if s["median"] > limit:
        return [("impossible", f"{100 * s['median']:.0f}% of the ceiling measured beside it is physically "
                               f"impossible (> {100 * limit:.0f}%): the ceiling's own timing was disturbed")]
    return []


def load_reasons(loads: Iterable[float | None], usable: int, online: int, own: int = 1) -> list[tuple[str, str]]:
    """The rule on the machine: its load average, less the bench's own ``own`` busy processes,
    above the online cores (== the usable cores unless the process is pinned to a subset)."""
    seen = [x for x in loads if x is not None]
    if not seen:
        return []
    top = max(seen)
    if top - own > online:
        where = f"its {online} cores" + (f" ({usable} usable here)" if online != usable else "")
        return [("busy", f"the machine was busy: load average {top:.2f}, less the bench's own processes, "
                         f"exceeded {where}")]
    return []


def judge(spreads: Mapping[str, Mapping[str, Any]], load: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:
    """A row's verdict from its figures' spreads (name -> spread()) and the table's load reasons:
    {"flagged", "rules", "reasons", "findings": [{"figure": name or None (the whole row), "rule", "why"}]}."""
    findings: list[dict[str, Any]] = []
    for name, s in spreads.items():
        rules = ratio_reasons(s) if s.get("judge") == "ratio" else \
            ceiling_reasons(s) if s.get("judge") == "ceiling" else \
            ceiling_reasons(s, STREAMED_CEILING_LIMIT) if s.get("judge") == "streamed_ceiling" else []
        findings += [{"figure": name, "rule": rule, "why": why} for rule, why in rules]
    findings += [{"figure": None, "rule": rule, "why": why} for rule, why in load]
    return {"flagged": bool(findings), "rules": sorted({f["rule"] for f in findings}),
            "reasons": [f"{f['figure']}: {f['why']}" if f["figure"] else f["why"] for f in findings],
            "findings": findings}


def flagged_figure(row: Mapping[str, Any], figure: str) -> bool:
    """Whether one figure of a row (or the whole row) is flagged."""
    return any(f["figure"] in (figure, None) for f in row.get("noise", {}).get("findings", []))


def judge_rows(rows: Iterable[dict[str, Any]], loads: Sequence[float | None], *, workers_key: str = "num_workers",
               machine: tuple[int, int] | None = None) -> None:
    """Set each row's "noise" from its "spread" and the load over its table (the bench's own
    processes: the main one and the row's workers)."""
    usable, online = machine or cores()
    for r in rows:
        own = 1 + int(r.get(workers_key) or 0)
        r["noise"] = judge(r.get("spread", {}), load_reasons(loads, usable, online, own))


def mark(row: Mapping[str, Any]) -> str:
    return MARK if row.get("noise", {}).get("flagged") else ""


def ratio_cell(s: Mapping[str, Any], digits: int | None = None) -> str:
    """'8.52x (8.10-9.02)': the median of the per-round ratios and their min-max (by default three
    significant figures or so: 2 decimals below 10, 1 below 100, none above)."""
    if digits is None:
        top = max(abs(s["median"]), abs(s["max"]))
        digits = 2 if top < 10 else 1 if top < 100 else 0
    return f"{s['median']:.{digits}f}x ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def percent_cell(s: Mapping[str, Any]) -> str:
    return f"{100 * s['median']:.0f}% ({100 * s['min']:.0f}-{100 * s['max']:.0f})"


def warning_lines(rows: Sequence[Mapping[str, Any]], label: Callable[[Mapping[str, Any]], str],
                  rounds: int | None = None, advice: str = ADVICE) -> list[str]:
    """After a table: which rows are flagged and why (a busy machine said once), and the advice.
    Empty when no row is flagged."""
    flagged = [r for r in rows if r.get("noise", {}).get("flagged")]
    if not flagged:
        return []
    busy = sorted({f["why"] for r in flagged for f in r["noise"]["findings"] if f["figure"] is None})
    lines = [f"{MARK} noise: {len(flagged)} of {len(rows)} rows cannot be trusted"
             + (f" ({rounds} rounds)" if rounds else "") + ":"]
    for r in flagged:
        own = [f"{f['figure']}: {f['why']}" for f in r["noise"]["findings"] if f["figure"] is not None]
        if own:
            lines.append(f"  {MARK} {label(r)}: " + "; ".join(own))
    for w in busy:
        hit = sum(any(f["why"] == w for f in r["noise"]["findings"]) for r in rows)
        lines.append(f"  {MARK} {'every row' if hit == len(rows) else f'{hit} of the rows'}: {w}")
    lines.append(f"  {advice}")
    return lines


def count(tables: Iterable[Iterable[Mapping[str, Any]]]) -> tuple[int, int]:
    """(flagged rows, rows) over tables."""
    flagged = total = 0
    for rows in tables:
        for r in rows:
            total += 1
            flagged += bool(r.get("noise", {}).get("flagged"))
    return flagged, total


def load_line(start: float | None, end: float | None, machine: tuple[int, int] | None = None) -> str:
    """'load average (1 min): 6.25 at the start, 7.10 at the end, on 2 usable cores'."""
    usable, online = machine or cores()
    where = f"{usable} usable cores" + (f" of {online} online" if online != usable else "")
    if start is None and end is None:
        return f"load average: unknown on this platform; {where}"
    parts = [f"{start:.2f} at the start" if start is not None else None,
             f"{end:.2f} at the end" if end is not None else None]
    return "load average (1 min): " + ", ".join(p for p in parts if p) + f", on {where}"
