"""`fastcollate bench`'s noise rules on made-up rounds (no timing), and the tables' spread column
and mark on made-up rows. (A real `bench --quick` run's spread and JSON: tests/test_cli.py.)"""
from __future__ import annotations

import pytest

from fastcollate._bench import collate_bench, markdown, noise, storage, sweep, workloads

IDLE = (2, 2)  # (usable, online) cores of a made-up machine


def rules(values, judge="ratio"):
    s = noise.spread(values, judge)
    return [r for r, _ in (noise.ratio_reasons(s) if judge == "ratio" else noise.ceiling_reasons(s))]


# --- the rules -------------------------------------------------------------------------------------

def test_spread_keeps_every_round_and_its_median():
    s = noise.spread([3.0, 1.0, 2.0])
    assert s == {"median": 2.0, "min": 1.0, "max": 3.0, "rounds": [3.0, 1.0, 2.0], "judge": "ratio"}
    assert noise.ratio_rounds([4.0, 9.0], [2.0, 3.0]) == [2.0, 3.0]
    with pytest.raises(ValueError):
        noise.ratio_rounds([1.0], [1.0, 2.0])
    with pytest.raises(ValueError):
        noise.spread([])


def test_a_ratio_far_from_1_with_a_narrow_spread_is_trusted():
    assert rules([8.1, 8.5, 9.0]) == []
    assert rules([0.50, 0.55]) == []  # consistently slower is a finding, not noise


def test_rounds_on_both_sides_of_1():
    assert rules([0.9, 1.2]) == ["straddles_1"]
    assert rules([0.95, 1.01, 1.3]) == ["straddles_1"]


def test_a_spread_wider_than_the_distance_from_1():
    # median 1.175, 0.25 wide: fastcollate vs default_collate not separable
    assert rules([1.05, 1.3]) == ["not_separable"]
    # the row: 62.6x then 15.0x -- far from 1, but the rounds do not agree on how far
    assert rules([62.6, 15.0]) == ["not_separable"]
    assert rules([0.6, 0.7]) == []  # 0.1 wide, its median 0.35 from 1
    assert rules([0.5, 0.95]) == ["not_separable"]  # 0.45 wide, its median (0.725) 0.275 from 1


def test_one_round_has_no_spread():
    assert rules([5.0]) == ["one_round"]


def test_physically_impossible_fractions_of_a_ceiling():
    assert rules([17.0, 17.0], "ceiling") == ["impossible"]  # the "1700% of memcpy"
    assert rules([1.35, 1.40], "ceiling") == ["impossible"]
    assert rules([1.10, 1.25], "ceiling") == []  # within jitter of 100%
    assert rules([0.4, 0.6], "ceiling") == []
    assert noise.judge({"of memcpy": noise.spread([5.0, 5.0], None)})["flagged"] is False  # not judged


def test_a_busy_machine():
    assert [r for r, _ in noise.load_reasons([6.25, 7.1], 2, 2, own=1)] == ["busy"]
    assert noise.load_reasons([2.5, 2.9], 2, 2, own=1) == []  # 1.9 beyond the bench's own: fits 2 cores
    assert [r for r, _ in noise.load_reasons([2.5, 4.1], 2, 2, own=2)] == ["busy"]
    assert noise.load_reasons([4.5], 2, 2, own=3) == []  # a table with 2 workers runs 3 processes itself
    assert noise.load_reasons([None, None], 2, 2) == []  # no load average on this platform
    # pinned to 2 of 64 cores: the load average counts the whole machine, compared with all its cores
    assert noise.load_reasons([30.0], 2, 64) == []
    assert [r for r, _ in noise.load_reasons([70.0], 2, 64)] == ["busy"]


def test_judge_collects_every_reason_with_its_figure():
    v = noise.judge({"speedup": noise.spread([0.9, 1.2]), "of memcpy": noise.spread([1.5, 1.6], "ceiling")},
                    noise.load_reasons([9.0], *IDLE))
    assert v["flagged"] and v["rules"] == ["busy", "impossible", "straddles_1"]
    assert [f["figure"] for f in v["findings"]] == ["speedup", "of memcpy", None]
    assert v["reasons"][0].startswith("speedup: rounds disagree") and v["reasons"][2].startswith("the machine")
    ok = noise.judge({"speedup": noise.spread([4.0, 4.2])})
    assert ok == {"flagged": False, "rules": [], "reasons": [], "findings": []}


def test_judge_rows_allows_for_the_benchs_own_workers():
    rows = [{"spread": {"x": noise.spread([4.0, 4.1])}, "num_workers": 2},
            {"spread": {"x": noise.spread([4.0, 4.1])}}]
    noise.judge_rows(rows, (3.5, 4.5), machine=IDLE)
    assert [r["noise"]["flagged"] for r in rows] == [False, True]


def test_flagged_figure():
    row = {"noise": noise.judge({"a": noise.spread([1.1, 0.9]), "b": noise.spread([3.0, 3.1])})}
    assert noise.flagged_figure(row, "a") and not noise.flagged_figure(row, "b")
    row = {"noise": noise.judge({"b": noise.spread([3.0, 3.1])}, [("busy", "the machine was busy")])}
    assert noise.flagged_figure(row, "b")


def test_warning_lines_say_which_rows_and_why_and_what_to_do():
    rows = [{"description": "good", "spread": {"speedup": noise.spread([5.0, 5.1])}},
            {"description": "straddling", "spread": {"speedup": noise.spread([0.9, 1.2])}}]
    noise.judge_rows(rows, (0.1, 0.2), machine=IDLE)
    lines = noise.warning_lines(rows, lambda r: r["description"], 2)
    assert lines[0] == f"{noise.MARK} noise: 1 of 2 rows cannot be trusted (2 rounds):"
    assert lines[1].startswith(f"  {noise.MARK} straddling: speedup: rounds disagree on which side of 1")
    assert lines[-1].strip() == noise.ADVICE and "--rounds" in noise.ADVICE and "idle" in noise.ADVICE
    assert not any("good" in line for line in lines)
    # a busy machine: said once for the table, not once per row
    noise.judge_rows(rows, (8.0, 9.0), machine=IDLE)
    lines = noise.warning_lines(rows, lambda r: r["description"], 2, noise.advice(quick=True))
    assert lines[0].startswith(f"{noise.MARK} noise: 2 of 2 rows")
    assert sum("the machine was busy" in line for line in lines) == 1 and "without --quick" in lines[-1]
    assert f"  {noise.MARK} every row: the machine was busy" in "\n".join(lines)
    assert noise.warning_lines([{"description": "x"}], str) == []
    assert noise.count([rows, [{"description": "x"}]]) == (2, 3)
    rows[0]["num_workers"] = 8  # the bench's own 9 processes explain the load of that row's table
    noise.judge_rows(rows, (8.0, 9.0), machine=IDLE)
    assert f"  {noise.MARK} 1 of the rows: the machine was busy" in "\n".join(noise.warning_lines(rows, str))


def test_cells():
    assert noise.ratio_cell(noise.spread([8.1, 8.52, 9.02])) == "8.52x (8.10-9.02)"
    assert noise.ratio_cell(noise.spread([15.0, 62.6])) == "38.8x (15.0-62.6)"
    assert noise.ratio_cell(noise.spread([491.0, 558.0])) == "524x (491-558)"
    assert noise.percent_cell(noise.spread([0.95, 1.02, 1.10])) == "102% (95-110)"
    assert noise.load_line(6.25, 7.1, IDLE) == \
        "load average (1 min): 6.25 at the start, 7.10 at the end, on 2 usable cores"
    assert noise.load_line(1.0, None, (2, 8)).endswith("on 2 usable cores of 8 online")


# --- the tables, from made-up rows -------------------------------------------------------------------

def collate_row(desc, nbytes, speedups, of_memcpy):
    return {"workload": desc, "description": desc, "batch_bytes": nbytes, "default_ms": 2.0, "fastcollate_ms": 1.0,
            "memcpy_ms": 0.5, "speedup": 0.0, "of_memcpy": 0.0,
            "spread": {"speedup": noise.spread(speedups),
                       "of memcpy": noise.spread(of_memcpy, "ceiling" if nbytes >= workloads.MEMCPY_MEANINGFUL_BYTES
                                                 else None)}}


def test_collate_table_prints_the_spread_and_marks_untrusted_rows():
    rows = [collate_row("steady", 40 << 20, [7.5, 7.9], [0.9, 1.0]),
            collate_row("impossible ceiling", 40 << 20, [7.5, 7.9], [16.0, 18.0]),
            collate_row("tiny straddling", 1000, [0.9, 1.3], [3.0, 3.0])]
    noise.judge_rows(rows, (0.0, 0.0), machine=IDLE)
    lines = collate_bench.format_table(rows).splitlines()
    assert "speedup (min-max)" in lines[0] and "of memcpy (min-max)" in lines[0] and lines[0].endswith("| noise |")
    steady, ceiling, tiny = lines[2:]
    assert "7.70x (7.50-7.90)" in steady and "95% (90-100)" in steady and not steady.rstrip(" |").endswith("!")
    assert "1700% (1600-1800)" in ceiling and ceiling.rstrip().endswith("!   |")
    assert "— |" in tiny and tiny.rstrip().endswith("!   |")  # below a megabyte the ceiling is not judged
    assert rows[2]["noise"]["rules"] == ["straddles_1"]
    assert len({len(line) for line in lines}) == 1  # columns stay aligned


def test_markdown_table_has_the_spread_the_load_and_the_warning(tmp_path):
    rows = [collate_row("steady", 40 << 20, [7.5, 7.9], [0.9, 1.0]),
            collate_row("straddling", 1000, [0.9, 1.3], [3.0, 3.0])]
    noise.judge_rows(rows, (0.5, 0.6), machine=IDLE)
    text = markdown.collate_markdown(rows, ["bench", "--quick"], backend="cpp", quick=True, rounds=2,
                                     min_time=0.05, loads=(0.5, 0.6))
    assert "load average (1 min): 0.50 at the start, 0.60 at the end" in text
    assert "min-max over rounds" in text and "7.70x (7.50-7.90)" in text
    assert "! noise: 1 of 2 rows cannot be trusted (2 rounds):" in text and "straddling: speedup" in text


def test_storage_and_sweep_tables_print_the_spread():
    rates = {"ours": [100.0, 110.0], "a": [10.0, 11.0], "b": [100.0, 90.0]}
    row = storage._row("tokens", 0, rates, {"baseline A": "a", "baseline B": "b"})
    assert row["speedup"]["baseline A"] == 10.0 and row["rounds_per_s"]["baseline B"] == [100.0, 90.0]
    noise.judge_rows([row], (0.0, 0.0), machine=IDLE)
    a, b = storage.format_storage_table([row]).splitlines()[2:]
    assert "10.0x (10.0-10.0)" in a and not a.rstrip(" |").endswith("!")
    assert "1.11x (1.00-1.22)" in b and b.rstrip().endswith("!   |")  # 1.0 then 1.22: not separable

    srow = {"batch_size": 16, "leaves_per_sample": 4, "default_ns_per_leaf": 90.0, "fastcollate_ns_per_leaf": 30.0,
            "default_gb_s": 0.7, "fastcollate_gb_s": 2.1, "spread": {"speedup": noise.spread([2.9, 3.1])}}
    noise.judge_rows([srow], (0.0, 0.0), machine=IDLE)
    assert "3.00x (2.90-3.10)" in sweep.format_table([srow])


def test_streaming_stores_may_beat_the_ordinary_copy_by_half():
    # 77 MB written with streaming stores: 137-145% of Tensor.copy_ measured, physical (one memory
    # transfer of three saved) -- flagged only beyond 1.5x the ordinary limit
    s = noise.spread([1.37, 1.45, 1.41], "streamed_ceiling")
    assert not noise.judge({"of memcpy": s})["flagged"]
    assert noise.judge({"of memcpy": noise.spread([1.37, 1.45, 1.41], "ceiling")})["flagged"]
    assert noise.judge({"of memcpy": noise.spread([2.1, 2.3, 2.2], "streamed_ceiling")})["flagged"]
