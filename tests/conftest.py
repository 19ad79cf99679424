import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import fastcollate  # noqa: E402

try:  # Hypothesis times its examples: a 200 ms deadline and a "too slow" health check fail on a busy
    # machine, not on a wrong result. Every property test here runs without them (explicit
    # @settings inherit this profile); HYPOTHESIS_PROFILE picks another where set.
    from hypothesis import HealthCheck, settings

    settings.register_profile("fastcollate", deadline=None, suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fastcollate"))
except ImportError:  # the property tests skip or fail on their own import
    pass


def pytest_configure(config):
    # A broken build must not pass on the Python fallback: the suite refuses to run without the
    # compiled engine, unless a run opts into the fallback explicitly.
    if fastcollate.backend() != "cpp" and os.environ.get("FASTCOLLATE_TEST_ALLOW_FALLBACK") != "1":
        from fastcollate import _ext

        raise pytest.UsageError(f"fastcollate's compiled backend is not in use: {_ext.LOAD_ERROR}")


# The slow set (pytest -m slow; the README's command leaves it out, CI runs it too): whole files
# that start clusters, launchers, frameworks or fresh venvs, and the tests that took 8 s or more
# (spawn-context ones 3 s or more) in a quiet run on 2 cores. Node-id prefixes.
SLOW = (
    "tests/integration/", "tests/test_node_cache.py", "tests/test_multinode.py", "tests/test_auto_follow.py",
    "tests/test_gpu_check_dry_run.py", "tests/test_setup.py", "tests/test_peers.py",
    "tests/test_cache.py::test_128_mb_cached_with_an_8_mb_dev_shm[spawn]",
    "tests/test_cache.py::test_any_sharing_strategy_shares_the_segments_themselves[spawn",
    "tests/test_cache.py::test_every_worker_reads_what_the_others_inserted[spawn",
    "tests/test_cache_wrapper.py::test_worker_init_fn_and_set_epoch_reach_the_dataset_in_workers[spawn]",
    "tests/test_cli.py::test_a_dataset_that_raises_is_named_with_its_error_and_index",
    "tests/test_cli.py::test_a_missing_optional_package_is_one_line_before_any_run",
    "tests/test_cli.py::test_a_worker_error_is_named_with_the_datasets_own_exception",
    "tests/test_cli.py::test_bench_plot",
    "tests/test_cli.py::test_doctor_names_the_dataset_stage_of_an_image_folder",
    "tests/test_cli.py::test_tune_measures_more_workers_than_cores_and_marks_them",
    "tests/test_doctor.py::test_randomness_a_weak_check_misses_never_gets_the_cache",
    "tests/test_doctor.py::test_spawned_workers_are_not_started_again_in_the_measuring_rounds",
    "tests/test_doctor_plan.py::test_the_budget_is_shared_among_the_phases",
    "tests/test_images_benchmark.py::test_the_benchmark_measures_every_contender",
    "tests/test_fuzz.py::test_workers_equal_torch_workers[collate-spawn]",
    "tests/test_fuzz.py::test_workers_equal_torch_workers[padding-spawn]",
    "tests/test_loader.py::test_a_getitems_returning_one_tensor_is_refused_as_torch_refuses_it",
    "tests/test_loader.py::test_a_loader_rebuilt_from_attributes_yields_batches_and_keeps_the_ring[spawn]",
    "tests/test_loader_processes.py::test_a_held_batch_sent_on_to_another_process[spawn",
    "tests/test_loader_processes.py::test_a_loader_passed_to_another_process_yields_its_batches[spawn]",
    "tests/test_loader_processes.py::test_held_batches_keep_no_file_descriptors[100000]",
    "tests/test_loader_processes.py::test_mp_spawn_with_a_loader",
    "tests/test_monitor_tune.py::test_tune_loader_measures_whole_epochs_of_every_loader",
    "tests/test_prefetch.py::test_break_close_context_manager_and_gc_join_the_thread",
    "tests/test_promotion.py::test_in_a_worker_a_conj_or_neg_view_first_is_torchs_error",
    "tests/test_ring.py::test_early_break_and_persistent_workers_leave_no_slot_behind",
    "tests/test_trace.py::test_trace_file_has_every_process_and_matching_ids[False-spawn]",
    "tests/test_with_ring.py::test_a_collator_subclass_call_runs_in_workers[2-spawn]",
    "tests/test_workers.py::test_main_process_loader_matches",
    "tests/test_workers.py::test_worker_batches_match_default_collate[spawn]",
)


def pytest_collection_modifyitems(config, items):
    import torch

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    slow = pytest.mark.slow
    for item in items:
        nodeid = os.path.relpath(str(item.path), root).replace(os.sep, "/") + item.nodeid[len(item.nodeid.split("::")[0]):]
        if nodeid.startswith(SLOW):
            item.add_marker(slow)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_disable(monkeypatch):
    monkeypatch.delenv("FASTCOLLATE_DISABLE", raising=False)
