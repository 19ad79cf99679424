"""The doctor's report as text: the user's settings and the proposal side by side (predicted and
measured), the findings, and the proposal as code to paste."""
from __future__ import annotations

import textwrap
from typing import Any

from .words import over_rounds

WIDTH = 100  # findings wrapped to this many columns: a terminal's, and a README's code block


def _rate(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def _code_lines(code: str) -> list[str]:
    """The proposal's one line of code, its arguments wrapped (still valid Python) when it is long."""
    if len(code) + 2 <= WIDTH or "(" not in code:
        return ["  " + code]
    head, args = code.split("(", 1)
    body = textwrap.wrap(args, WIDTH - 6, break_on_hyphens=False)
    return ["  " + head + "("] + ["      " + line for line in body]


def format_diagnosis(d: Any, dataset: str = "dataset") -> str:
    b, p = d.baseline, d.proposal
    same = not p["changes"]
    lines = ["", f"bottleneck: {d.bottleneck}", "",
             f"{'samples/s':<22} {'your settings':>16} {'proposal':>16}",
             f"{'  predicted':<22} {_rate(b.get('predicted_samples_per_s')):>16} {_rate(p['predicted_samples_per_s']):>16}",
             f"{'  measured':<22} {_rate(b['samples_per_s']):>16} "
             f"{_rate(p['measured_samples_per_s'] if not same else b['samples_per_s']):>16}"
             if b.get("measured", True) else
             f"{'  traced (not timed)':<22} {_rate(b['samples_per_s']):>16} {'-':>16}"]
    spread = b.get("spread")
    if spread and spread.get("rounds"):
        span = over_rounds(f"{spread['min']:,.0f}", f"{spread['max']:,.0f}", spread["rounds"])
        lines.append(f"{'  your spread':<22} {span}")
    if d.ceiling_samples_per_s is not None:
        lines.append(f"{'  ceiling (data free)':<22} {_rate(d.ceiling_samples_per_s):>16}")
    lines.append("")
    lines.append("changes:" if p["changes"] else "changes: none (your settings stay)")
    lines += [textwrap.fill(c, WIDTH, initial_indent="  - ", subsequent_indent="    ") for c in p["changes"]]
    lines.append("findings:")
    lines += [textwrap.fill(f, WIDTH, initial_indent="  - ", subsequent_indent="    ") for f in d.findings]
    cost = p.get("memory_mb")
    if cost:
        lines.append(f"the proposal holds ~{cost['total']:.0f} MB: workers {cost['workers']:.0f} MB, batches in flight "
                     f"{cost['batches_in_flight']:.0f} MB, cache {cost['cache']:.0f} MB")
    mem = d.memory
    if mem.get("workers_private_mb") and mem.get("measured_in"):
        lines.append(f"a worker's private memory: up to {max(mem['workers_private_mb']):.0f} MB "
                     f"(in {mem['measured_in']})")
    elif mem.get("workers_private_mb"):
        lines.append(f"workers' private memory: {', '.join(f'{m:.0f} MB' for m in mem['workers_private_mb'])} "
                     + (f"(grew {mem['growth_mb']:.0f} MB each)" if mem["growth_mb"] >= 0.5 else
                        "(did not grow)"))
    if p["changes"]:
        lines += ["", "the proposal, as code:", "  import fastcollate, torch",
                  f"  dataset = ...  # {dataset}", *_code_lines(d.code())]
    lines.append(f"(the doctor took {d.elapsed_s:.1f} s)")
    return "\n".join(lines)
