"""Each command runs and exits 0; bad arguments give one clear line and a non-zero exit."""
import json
import os
import re
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")


def run(*args, timeout=1200):
    # a deadline only a hang reaches: `bench --quick` took 77-84 s beside 4 busy processes on 2
    # cores (300 s was 4x from failing); what a run asserts is its output, never its time
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, TESTS, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "fastcollate", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=TESTS)


def test_bench_quick(tmp_path):
    out, md = tmp_path / "b.json", tmp_path / "collate.md"
    r = run("bench", "--quick", "--workloads", "tiny,nested", "--json", str(out), "--markdown", str(md))
    assert r.returncode == 0, r.stderr
    # the Markdown table names what made it: the command, the machine, torch, and that it was a quick run
    text = md.read_text()
    assert f"`fastcollate bench --quick --workloads tiny,nested --json {out} --markdown {md}`" in text
    assert "usable cores" in text and f"torch {torch.__version__}" in text and "a quick run" in text
    assert "| 4 x {uint8" in text and "| 256 x nested" in text and "|---" in text
    # ... and the run's other tables, each under its title with its load
    for title in ("## Padding", "## Loaders", "## A new loader", "## Storage"):
        assert title in text, title
    # the header's "- load average (1 min)" and each later table's "Load average (1 min)"
    assert text.lower().count("load average (1 min)") >= 5 and "vs torch workers (min-max)" in text
    assert "speedup" in r.stdout and "end-to-end" in r.stdout and "-bound" in r.stdout
    assert "[collate 1/2] tiny" in r.stderr  # progress
    data = json.loads(out.read_text())
    assert [row["workload"] for row in data["collate"]] == ["tiny", "nested"] and len(data["train"]) == 2
    # batches far below a megabyte: the memcpy column says nothing, and says so
    tiny_row = next(line for line in r.stdout.splitlines() if line.startswith("| 4 x {uint8"))
    assert [c.strip() for c in tiny_row.split("|")][-3] == "—", tiny_row  # then the noise column
    # every ratio with its spread over rounds and the noise mark; the load average at the start and end
    assert r.stdout.startswith("fastcollate bench:") and "load average (1 min):" in r.stdout.splitlines()[0]
    assert "at the end, on" in r.stdout and ("cannot be trusted" in r.stdout or "separable from 1" in r.stdout)
    for head in ("speedup (min-max)", "of memcpy (min-max)", "vs torch workers (min-max)", "epoch 1 (min-max)"):
        assert head in r.stdout, head
    assert all(line.rstrip().endswith("|") and "x (" in line for line in r.stdout.splitlines()
               if line.startswith(("| 4 x {uint8", "| 256 x nested", "| TokenWindows")))
    assert "load average (1 min):" in text and "at the end" in text and "min-max over rounds" in text
    assert set(data["load_average"]) == {"start", "end", "usable_cores", "online_cores"}
    assert data["noise"]["rows"] >= 2 + 4 + 2 + 1 + 4 + 1
    for table in ("collate", "pad", "loaders", "storage"):
        for row in data[table]:
            assert set(row["noise"]) >= {"flagged", "rules", "reasons"}, table
            for s in row["spread"].values():
                assert len(s["rounds"]) == 2 and s["min"] <= s["median"] <= s["max"], table
    assert len(data["collate"][0]["rounds_ms"]["memcpy"]) == 2 and "noise" in data["startup"]
    assert len(data["train"][1]["spread"]["vs default_collate"]["rounds"]) == 2
    assert "a NEW loader, first epoch" in r.stdout and data["startup"]["epoch_speedup"] > 0
    # the storage table: every workload present, each baseline a measured rate
    assert "batches from storage" in r.stdout and "TokenWindows 64 x 1024" in r.stdout
    names = [row["description"] for row in data["storage"]]
    assert any("0 workers" in n for n in names) and any("2 workers" in n for n in names)
    assert all(row["ours"] > 0 and all(v > 0 for v in row["baselines"].values()) for row in data["storage"])


def test_bench_sweep_table_and_plot(tmp_path):
    pytest.importorskip("matplotlib")
    out, png = tmp_path / "s.json", tmp_path / "s.png"
    r = run("bench", "--sweep", "--quick", "--json", str(out), "--plot", str(png))
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())["sweep"]
    assert [(x["batch_size"], x["leaves_per_sample"]) for x in rows] == [(b, k) for k in (1, 16) for b in (1, 16, 256)]
    assert all(x["fastcollate_ns_per_leaf"] > 0 and x["default_gb_s"] > 0 for x in rows)
    assert all(len(x["spread"]["speedup"]["rounds"]) == 2 and "flagged" in x["noise"] for x in rows)
    assert "ns/leaf" in r.stdout and "speedup (min-max)" in r.stdout and "load average (1 min)" in r.stdout
    assert png.stat().st_size > 10_000


def test_tune():
    r = run("tune", "--dataset", "cli_dataset:DATASET", "--batch-size", "16", "--budget", "3", "--workers", "0")
    assert r.returncode == 0, r.stderr
    assert "best:" in r.stdout and "samples/s" in r.stdout and "spread" in r.stdout


def test_doctor():
    r = run("doctor")
    assert r.returncode == 0, r.stderr
    assert "compiled backend" in r.stdout and "cpp" in r.stdout and "-bound" in r.stdout


def test_doctor_with_a_dataset_proposes_and_proves_by_default(tmp_path):
    # the CLI proves as the API does (verify=True): no flag needed
    trace, png, out = tmp_path / "t.json", tmp_path / "t.png", tmp_path / "d.json"
    r = run("doctor", "--dataset", "cli_dataset:DATASET", "--batch-size", "16", "--loader-kwargs", '{"num_workers": 2}',
            "--epochs", "1", "--json", str(out), "--trace", str(trace), "--plot", str(png))
    assert r.returncode == 0, r.stderr
    assert "your settings" in r.stdout and "proposal" in r.stdout and "bottleneck:" in r.stdout
    assert "measured" in r.stdout and "/dev/shm" in r.stdout
    d = json.loads(out.read_text())
    assert d["baseline"]["settings"]["num_workers"] == 2 and d["proposal"]["predicted_samples_per_s"] > 0
    if d["proposal"]["changes"]:
        assert "the proposal, as code:" in r.stdout and "loader = " in r.stdout
        assert d["proposal"]["measured_samples_per_s"] > 0
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("name") == "fetch" for e in events) and png.stat().st_size > 10_000


def test_doctor_predicts_only_when_asked(tmp_path):
    out = tmp_path / "d.json"
    r = run("doctor", "--dataset", "cli_dataset:DATASET", "--batch-size", "16", "--workers", "0", "--epochs", "1",
            "--predict-only", "--ranks", "2", "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "bottleneck:" in r.stdout and "predicted" in r.stdout
    d = json.loads(out.read_text())
    assert d["proposal"]["measured_samples_per_s"] is None
    assert d["node"]["ranks"] == 2 and "local 0 of 2" in r.stdout


@pytest.mark.parametrize("argv, words", [
    (["--budget", "-1"], "--budget must be > 0"),
    (["--budget", "0"], "--budget must be > 0"),
    (["--ranks", "0"], "--ranks must be >= 1"),
    (["--fix", "--predict-only"], "contradict"),
])
def test_doctor_refuses_bad_options_in_one_line(argv, words):
    r = run("doctor", "--dataset", "cli_dataset:DATASET", *argv)
    assert r.returncode == 2 and words in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_doctor_names_the_dataset_stage_of_an_image_folder():
    pytest.importorskip("PIL")
    r = run("doctor", "--dataset", "fastcollate._bench.image_bench:dataset", "--batch-size", "16", "--workers", "2",
            "--epochs", "1")
    assert r.returncode == 0, r.stderr
    assert "bottleneck: dataset" in r.stdout and "samples, in 2 workers: the dataset" in r.stdout


def test_doctor_refuses_an_unwritable_trace_path(tmp_path):
    r = run("doctor", "--dataset", "cli_dataset:DATASET", "--trace", str(tmp_path / "no" / "t.json"))
    assert r.returncode == 2 and "does not exist" in r.stderr and r.stderr.count("\n") == 1


def test_help_everywhere():
    for args in ([], ["bench"], ["tune"], ["doctor"]):
        r = run(*args, "--help")
        assert r.returncode == 0 and "usage:" in r.stdout


def test_bench_help_lists_the_peers_that_run():
    # Ray Data is not in the peers table (bench --engines compares it on its own)
    from fastcollate.cli import build_parser

    bench = build_parser()._subparsers._group_actions[0].choices["bench"]
    helps = {a.dest: a.help for a in bench._actions}
    assert "Ray" not in helps["peers"].split("(Ray Data: see --engines)")[0]
    assert "Ray Data" in helps["engines"]


def test_bench_markdown_refuses_a_missing_folder(tmp_path):
    r = run("bench", "--quick", "--markdown", str(tmp_path / "no" / "t.md"))
    assert r.returncode == 2 and "does not exist" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("args,needle", [
    (["bench", "--workloads", "nope"], "unknown workload"),
    (["bench", "--rounds", "0"], "--rounds"),
    (["bench", "--rounds", "x"], "invalid int"),
    (["tune", "--batch-size", "4"], "--dataset"),
    (["tune", "--dataset", "nomodule_xyz:DS", "--batch-size", "4"], "cannot import"),
    (["tune", "--dataset", "cli_dataset", "--batch-size", "4"], "module:attr"),
    (["tune", "--dataset", "cli_dataset:MISSING", "--batch-size", "4"], "no attribute"),
    (["tune", "--dataset", "cli_dataset:DATASET", "--batch-size", "0"], "--batch-size"),
    (["tune", "--dataset", "cli_dataset:DATASET", "--batch-size", "4", "--workers", "-1"], "--workers"),
    (["tune", "--dataset", "cli_dataset:DATASET", "--batch-size", "4", "--workers", "1,x"], "--workers"),
    (["doctor", "--dataset", "cli_dataset:DATASET", "--batch-size", "0"], "--batch-size"),
    (["doctor", "--dataset", "cli_dataset:DATASET", "--workers", "-1"], "--workers"),
    (["doctor", "--dataset", "cli_dataset:DATASET", "--epochs", "0"], "--epochs"),
    (["doctor", "--dataset", "cli_dataset:DATASET", "--loader-kwargs", "[1]"], "JSON object"),
    (["doctor", "--dataset", "cli_dataset:DATASET", "--loader-kwargs", "{nope"], "JSON object"),
    (["doctor", "--dataset", "cli_dataset:DATASET", "--loader-kwargs", '{"num_workers": -2}'], "num_workers"),
    (["doctor", "--dataset", "cli_dataset:DATASET", "--loader-kwargs", '{"num_workers": 2, "prefetch_factor": 0}'],
     "prefetch_factor"),
    (["doctor", "--dataset", "cli_dataset:DATASET", "--loader-kwargs", '{"prefetch_factor": 2}'], "prefetch_factor"),
    (["doctor", "--dataset", "cli_dataset:DATASET", "--loader-kwargs", '{"num_workers": 1, "timeout": -1}'],
     "timeout"),
    (["tune", "--dataset", "cli_dataset:DATASET", "--batch-size", "4", "--epochs", "0"], "--epochs"),
    (["bench", "--peers", "--workers", "-1"], "--workers"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_arguments_one_line_nonzero(args, needle):
    r = run(*args)
    assert r.returncode != 0
    lines = [l for l in r.stderr.strip().splitlines() if l.startswith("fastcollate: error")]
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_bench_plot(tmp_path):
    target = tmp_path / "speedups.png"
    r = run("bench", "--quick", "--workloads", "tiny", "--no-train", "--plot", str(target))
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert r.returncode == 2 and "needs matplotlib" in r.stderr and "Traceback" not in r.stderr
        return
    assert r.returncode == 0 and target.stat().st_size > 0, r.stderr


def test_a_missing_optional_package_is_one_line_before_any_run(tmp_path):
    # Pillow for the image workload, matplotlib for --plot: checked before anything runs, so that
    # no result is lost to an error at the end
    code = (
        "import sys\n"
        "sys.modules['PIL'] = sys.modules['matplotlib'] = None  # as if not installed\n"
        "from fastcollate.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n")
    cases = [(["doctor", "--dataset", "fastcollate._bench.image_bench:dataset"], "pillow"),
             (["tune", "--dataset", "fastcollate._bench.image_bench:dataset", "--batch-size", "4"], "pillow"),
             (["doctor", "--dataset", "cli_dataset:DATASET", "--plot", str(tmp_path / "p.png")], "matplotlib"),
             (["bench", "--peers", "--quick"], "pillow"),
             (["bench", "--quick", "--workloads", "tiny", "--no-train", "--plot", str(tmp_path / "b.png")],
              "matplotlib")]
    for args, needle in cases:
        r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=TESTS,
                           env={**os.environ, "PYTHONPATH": ROOT + os.pathsep + TESTS})
        lines = [l for l in r.stderr.strip().splitlines() if l.startswith("fastcollate: error")]
        assert r.returncode == 2 and len(lines) == 1 and needle in lines[0], r.stderr
        assert "Traceback" not in r.stderr and "doctor:" not in r.stderr  # nothing ran


def _one_error_line(r):
    """The run failed with one line on stderr (progress lines aside) and no traceback: that line."""
    assert r.returncode != 0, r.stdout[-2000:]
    assert "Traceback" not in r.stderr, r.stderr[-4000:]
    lines = [l for l in r.stderr.strip().splitlines() if l.startswith("fastcollate")]
    assert len(lines) == 1 and r.stderr.strip().splitlines()[-1] == lines[0], r.stderr[-4000:]
    return lines[0]


@pytest.mark.parametrize("command", [["doctor", "--workers", "0", "--epochs", "1"],
                                     ["doctor", "--workers", "2", "--epochs", "1"],
                                     ["tune", "--workers", "0,2", "--budget", "20"]])
def test_a_dataset_that_raises_is_named_with_its_error_and_index(command):
    # in this process the index comes from the dataset's __getitem__ frame
    r = run(command[0], "--dataset", "cli_dataset:BROKEN", "--batch-size", "4", *command[1:])
    line = _one_error_line(r)
    # with workers, the doctor's traced fetch notes the index on the exception the worker sends
    assert re.match(rf"fastcollate {command[0]}: the dataset raised ZeroDivisionError at index 5"
                    r"( in DataLoader worker process \d+)?: division by zero \(traceback: ", line), line
    where = line.rsplit("(traceback: ", 1)[1].rstrip(")")
    with open(where) as f:
        assert "return 1 / 0" in f.read()  # the whole traceback is kept for the user's fix
    os.remove(where)


def test_a_worker_error_is_named_with_the_datasets_own_exception():
    r = run("tune", "--dataset", "cli_dataset:BrokenInWorkers", "--batch-size", "4", "--workers", "2", "--budget", "20")
    line = _one_error_line(r)
    assert line.startswith("fastcollate tune: the dataset raised ValueError in DataLoader worker process "), line
    assert "(the worker did not report the index): the file of sample 5 is truncated (traceback: " in line, line
    assert "budget" not in line
    os.remove(line.rsplit("(traceback: ", 1)[1].rstrip(")"))


def test_failures_explain_themselves_in_one_line():
    from fastcollate._cli_errors import failure

    try:
        raise RuntimeError("first line\nsecond line")
    except RuntimeError as exc:
        assert failure(exc, None) == "RuntimeError: first line ..."


@pytest.mark.parametrize("spec,needle", [
    ("cli_dataset:NeedsRoot", "cli_dataset:NeedsRoot is a class, made with no arguments, and NeedsRoot() raised "
                              "TypeError: "),
    ("cli_dataset:broken_factory", "broken_factory() raised FileNotFoundError: no such folder: /data/imagenet"),
    ("cli_dataset:NoLen", "cli_dataset:NoLen has no __len__"),
])
def test_a_dataset_that_cannot_be_made_or_measured_is_one_line(spec, needle):
    for command in (["tune", "--batch-size", "4"], ["doctor"]):
        r = run(*command, "--dataset", spec)
        line = _one_error_line(r)
        assert r.returncode == 2 and line.startswith("fastcollate: error: ") and needle in line, line


def test_a_dataset_class_is_made_with_no_arguments():
    r = run("tune", "--dataset", "cli_dataset:Images", "--batch-size", "16", "--budget", "3", "--workers", "0")
    assert r.returncode == 0, r.stderr
    assert "best: torch's DataLoader with" in r.stdout or "best: fastcollate.DataLoader" in r.stdout, r.stdout


def test_tune_measures_more_workers_than_cores_and_marks_them():
    cores = len(os.sched_getaffinity(0))
    many = 2 * cores
    r = run("tune", "--dataset", "cli_dataset:DATASET", "--batch-size", "64", "--budget", "6",
            "--workers", f"0,{many}")
    assert r.returncode == 0, r.stderr
    rows = [l for l in r.stdout.splitlines() if l.startswith(f"| {many:>7} |")]
    assert rows and all(f"more workers than the {cores} usable cores" in l for l in rows), r.stdout
