"""fastcollate.doctor's decisions on real runs, on the CPU: what it may propose (never a change
that alters a batch, never the cache without proof), that it runs where the user's loader runs,
what it says. Nothing here asserts a timing -- how fast the doctor's proposal is, and how close
its predictions come, is measured by benchmarks/doctor_acceptance.py -- so a busy machine cannot
fail these tests; the decisions on given measurements are tested in test_doctor_plan.py."""
from __future__ import annotations

import dataclasses
import os

import pytest
import torch
import torch.utils.data as tud

import fastcollate
import doctor_data as dd


def test_deterministic_expensive_dataset_may_be_cached():
    # proven deterministic on every index, and its fetch dominates: the cache is allowed and modelled
    ds = dd.Expensive(n=128, per_sample=1e-3)
    d = fastcollate.doctor(ds, batch_size=32, epochs=3, num_workers=2, verify=False)
    assert d.cache["state"] == "yes", d.cache
    assert d.cache["proof"]["verdict"] == "proven" and d.cache["proof"]["checked"] == 128, d.cache


def test_random_dataset_is_not_cached_and_the_split_is_explained():
    ds = dd.Expensive(n=128, per_sample=1e-3)
    ds.__class__ = type("Augmented", (dd.Expensive,), {"__getitem__": lambda self, i: {
        **dd.Expensive.__getitem__(self, i), "noise": __import__("torch").rand(1)}})
    d = fastcollate.doctor(ds, batch_size=32, epochs=2, num_workers=2, verify=False)
    assert not d.proposal["cache"]
    assert any("Cached(base, transform=" in f for f in d.findings), d.findings


def test_millions_of_python_objects_are_named_copy_on_write():
    ds = dd.PythonObjects(n=128, objects=2_000_000)
    d = fastcollate.doctor(ds, batch_size=16, epochs=1, num_workers=2, verify=False)
    assert d.memory["finding"] == "copy_on_write", d.memory
    assert any("numpy arrays" in f and "ArrayDataset" in f for f in d.findings), d.findings


def test_diagnosis_is_json_and_code():
    d = fastcollate.doctor(dd.Cheap(n=64), batch_size=16, epochs=1, num_workers=0, verify=False)
    out = d.to_dict()
    assert set(out) >= {"bottleneck", "baseline", "proposal", "ceiling_samples_per_s", "memory", "findings",
                        "elapsed_s"}
    assert set(out["proposal"]) >= {"settings", "loader", "cache", "changes", "predicted_samples_per_s",
                                    "measured_samples_per_s"}
    assert d.code().startswith("loader = ")
    batch = next(iter(d.loader(dd.Cheap(n=64))))
    assert batch["x"].shape == (16, 8)


@pytest.mark.parametrize("bad, msg", [(dict(batch_size=0), "batch_size"), (dict(batch_size=4, epochs=0), "epochs"),
                                      (dict(batch_size=4, loader="x"), "loader")])
def test_bad_arguments(bad, msg):
    with pytest.raises(ValueError, match=msg):
        fastcollate.doctor(dd.Cheap(n=8), **bad)


def _own_collate(items):
    out = tud.default_collate(items)
    out["own"] = len(items)
    return out


@pytest.mark.parametrize("loader", ["torch", "fastcollate"])
def test_your_own_collate_stays_in_every_proposal(loader):
    # the user's collate_fn must never be swapped for another: the proposal keeps it, in the
    # loader they use (fastcollate.DataLoader with a custom collate once crashed the doctor)
    d = fastcollate.doctor(dd.Cheap(n=64), batch_size=16, epochs=1, loader=loader, verify=False,
                           collate_fn=_own_collate, num_workers=0)
    assert d.proposal["loader"] == loader
    assert all(p["setting"]["kind"] == ("fastcollate" if loader == "fastcollate" else "torch")
               for p in d.predictions)
    assert next(iter(d.loader(dd.Cheap(n=64))))["own"] == 16


def test_no_advice_to_use_what_is_already_used():
    class Batched(dd.Cheap):
        def __getitems__(self, idx):
            return [self[i] for i in idx]

    d = fastcollate.doctor(Batched(n=256), batch_size=32, epochs=2, num_workers=0, verify=False)
    assert not any("__getitems__" in f for f in d.findings), d.findings
    cached = fastcollate.Cached(dd.Expensive(n=64, per_sample=1e-4))
    d = fastcollate.doctor(cached, batch_size=16, epochs=2, num_workers=0, verify=False)
    assert not d.proposal["cache"] and not any("Cached(" in f for f in d.findings), d.findings


def test_the_loader_arguments_are_checked_before_anything_runs():
    from fastcollate.doctor.diagnose import LoaderArgumentsError

    for kw, msg in ((dict(num_workers=2, prefetch_factor=0), "prefetch_factor"),
                    (dict(prefetch_factor=2), "prefetch_factor"), (dict(num_workers=-1), "num_workers"),
                    (dict(num_workers=1, multiprocessing_context="nope"), "multiprocessing_context")):
        with pytest.raises(LoaderArgumentsError, match=msg):
            fastcollate.doctor(dd.Cheap(n=8), batch_size=4, **kw)


def _facts(**kw):
    from fastcollate.doctor import look as doctor_look
    from fastcollate.doctor import words as doctor_words
    from fastcollate.tuning import model

    seen = doctor_look.Look(profile=model.Profile("torch", 0, [0.01], [0.009], 0.01, 0.0), spikes_s=[0.0],
                            step_s=0.0, samples_per_s=100.0, batch_bytes=1 << 20, memory={}, report={})
    base = model.Setting("torch", 0)
    work = model.Workload(batches=10, batch_size=32, epochs=2, cores=2)
    return doctor_words.Facts(**{"seen": seen, "base": base, "chosen": base, "picks": [], "verdict": None,
                                 "work": work, "base_rate": 100.0, "verified": False, **kw})


def test_with_a_gpu_the_transfer_and_augmentation_advice_is_given():
    # the doctor's runs stay on the host: on a CUDA machine it advises (never measures) the
    # prefetcher and moving random augmentation after the copy -- checked here without a GPU by
    # handing findings() what a CUDA machine would
    from fastcollate.doctor import words as doctor_words

    why = "index 3 gave different samples in worker 0 and in worker 1"
    words = doctor_words.findings(_facts(cache_why=why, cuda=True, pinned=True))
    assert any("CudaPrefetcher(loader)" in w and "pin_memory=False" in w for w in words), words
    assert any("transform=" in w and "after the copy" in w for w in words), words
    assert not any("CudaPrefetcher" in w for w in doctor_words.findings(_facts(cache_why=why)))


def test_a_span_of_one_round_reads_as_one_round():
    from fastcollate.doctor.words import over_rounds
    assert over_rounds("1.68", "1.75", 2, "x") == "1.68-1.75x over 2 rounds"
    assert over_rounds("15.06", "15.06", 1, "x") == "15.06x in one round"
    assert over_rounds("626", "652", 3) == "626-652 over 3 rounds"


def test_a_candidate_that_lost_is_named_and_no_line_denies_its_prediction():
    # the model predicted a gain, the measured rounds refused it: the words say what was tried and
    # what was predicted, and no line says that nothing predicted a gain
    from fastcollate.doctor import words as doctor_words
    from fastcollate.tuning import model

    base = model.Setting("torch", 0)
    tried = model.Setting("fastcollate", 2, 2, True)
    verdict = {"ratio": 0.58, "min": 0.57, "max": 0.60, "rounds": 2, "win": False, "loss": True,
               "candidate": doctor_words.changes(base, tried), "more_workers": True, "predicted_ratio": 1.7}
    text = " ".join(doctor_words.findings(_facts(picks=[tried], verdict=verdict, verified=True)))
    assert "no loader setting predicts" not in text, text
    assert "num_workers 0 -> 2" in text and "predicted 1.70x" in text and "0.58x" in text, text
    assert "busy with other work" in text, text
    # a loss with no extra workers gives no guessed reason
    verdict.update(more_workers=False)
    text = " ".join(doctor_words.findings(_facts(picks=[tried], verdict=verdict, verified=True)))
    assert "busy with other work" not in text and "your settings stay" in text


def test_the_cache_first_epoch_pays_its_writes():
    # a cheap dataset whose samples cost more to insert than they save when read back: the
    # model must not predict the cache faster (it once did, and the doctor measured 0.44x)
    from fastcollate.tuning import model

    prof = model.Profile("torch", 0, make_s=[1e-3] * 4, fetch_s=[0.9e-3] * 4, worker_cpu_s=1e-3, main_cpu_s=0.0)
    plain = model.Setting("torch", 0)
    cached = model.Setting("torch", 0, cache=True)
    work = model.Workload(batches=128, batch_size=32, epochs=2, cores=2, cached_fetch_s=0.8e-3,
                          cached_write_s=1.6e-3)
    assert model.predict(cached, prof, work)["samples_per_s"] < model.predict(plain, prof, work)["samples_per_s"]
    # an expensive fetch is still worth caching once its writes are paid
    costly = model.Profile("torch", 0, make_s=[20e-3] * 4, fetch_s=[19e-3] * 4, worker_cpu_s=20e-3, main_cpu_s=0.0)
    assert model.predict(cached, costly, work)["samples_per_s"] > model.predict(plain, costly, work)["samples_per_s"]
    for w in (0, 2):  # and with workers, the first epoch is slower than without the cache
        s_plain, s_cached = model.Setting("torch", w, 2, True), model.Setting("torch", w, 2, True, cache=True)
        one = dataclasses.replace(work, epochs=1)
        assert model.predict(s_cached, prof, one)["seconds"] > model.predict(s_plain, prof, one)["seconds"]


# ---- speed never changes what the loop sees -------------------------------------------------------

@pytest.fixture(scope="module")
def records(tmp_path_factory):
    path = tmp_path_factory.mktemp("doctor") / "records.bin"
    path.write_bytes(os.urandom(64 * 1024))
    return str(path)


def _adversarial(records):
    return {"flip": (dd.Flip(), {"num_workers": 2}),
            "set_epoch": (dd.EpochDependent(), {"num_workers": 2}),
            "worker-seeded": (dd.WorkerSeeded(), {"num_workers": 2, "worker_init_fn": dd.seed_worker}),
            "minority": (dd.Minority(), {"num_workers": 0}),
            "reads a file": (dd.ReadsFile(records), {"num_workers": 0})}


def _batches(loader, epochs, dataset=None, seed=0):
    """Every batch of ``epochs`` epochs, set_epoch called as a training loop calls it."""
    torch.manual_seed(seed)
    out = []
    for e in range(epochs):
        if dataset is not None and hasattr(dataset, "set_epoch"):
            dataset.set_epoch(e)
        out.append([{k: v.clone() for k, v in b.items()} for b in loader])
    if dataset is not None and hasattr(dataset, "set_epoch"):
        dataset.set_epoch(0)
    return out


def _equal(a, b):
    return len(a) == len(b) and all(x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
                                    for x, y in zip(a, b))


@pytest.mark.parametrize("name", ["flip", "set_epoch", "worker-seeded", "minority", "reads a file"])
def test_randomness_a_weak_check_misses_never_gets_the_cache(name, records):
    # each was proposed the cache by the old check (indices 0, n/2, n-1 fetched twice in the main
    # process): the proposal then froze its augmentation. benchmarks/doctor_acceptance.py runs 20
    ds, kw = _adversarial(records)[name]
    for _ in range(3):
        d = fastcollate.doctor(ds, batch_size=8, epochs=2, verify=False, **kw)
        assert not d.proposal["cache"], (name, d.cache)
        assert d.cache["state"] != "yes", (name, d.cache)
        loader = d.loader(ds)
        assert not isinstance(loader.dataset, fastcollate.Cached)
    if name == "set_epoch":
        assert d.cache["proof"]["verdict"] == "epoch"
        assert not d.proposal["settings"].get("persistent_workers"), d.proposal
    elif name == "reads a file":
        assert d.cache["state"] == "conditional" and d.cache["proof"]["verdict"] == "proven", d.cache
    else:
        assert d.cache["proof"]["verdict"] == "random", d.cache


@pytest.mark.parametrize("name", ["flip", "set_epoch", "worker-seeded", "minority"])
def test_what_the_doctor_proposes_does_not_change_a_batch(name, records):
    ds, kw = _adversarial(records)[name]
    d = fastcollate.doctor(ds, batch_size=8, epochs=2, verify=False, **kw)
    user = tud.DataLoader(ds, batch_size=8, **kw)
    mine, theirs = _batches(d.loader(ds), 2, ds), _batches(user, 2, ds)
    if name == "set_epoch":  # deterministic given the epoch: the very same batches, epoch by epoch
        assert all(_equal(a, b) for a, b in zip(mine, theirs)), d.proposal
    else:  # random: never frozen -- the proposal's second epoch is not its first
        assert not _equal(mine[0], mine[1]), d.proposal


def test_a_deterministic_shuffled_dataset_gives_the_users_batches():
    ds = dd.Expensive(n=96, per_sample=1e-4)
    kw = {"num_workers": 0, "shuffle": True}
    d = fastcollate.doctor(ds, batch_size=16, epochs=2, verify=False, **kw)
    assert all(_equal(a, b) for a, b in zip(_batches(d.loader(ds), 2), _batches(tud.DataLoader(ds, 16, **kw), 2)))


# ---- it runs where the user's loader runs ---------------------------------------------------------

def test_an_iterable_dataset_keeps_its_workers_and_its_batches():
    ds = dd.Stream()
    d = fastcollate.doctor(ds, batch_size=8, epochs=2, verify=False, num_workers=2)
    assert d.proposal["settings"]["num_workers"] == 2 and not d.proposal["cache"], d.proposal
    assert all(p["setting"]["num_workers"] == 2 for p in d.predictions), d.predictions
    assert any("IterableDataset" in f for f in d.findings), d.findings
    assert all(_equal(a, b) for a, b in zip(_batches(d.loader(ds), 1), _batches(tud.DataLoader(ds, 8, num_workers=2),
                                                                                  1)))


def test_string_keys_with_a_custom_sampler():
    ds = dd.StringKeys()
    d = fastcollate.doctor(ds, batch_size=8, epochs=2, verify=False, sampler=ds.keys())
    assert d.cache["proof"]["verdict"] == "keys" and not d.proposal["cache"], d.cache
    assert "sampler=" in d.code() and "0x" not in d.code(), d.code()


def test_a_worker_init_fn_that_opens_the_file(records):
    ds = dd.OpensInWorker(records)
    d = fastcollate.doctor(ds, batch_size=8, epochs=2, verify=False, num_workers=2, worker_init_fn=dd.open_in_worker)
    assert all(p["setting"]["num_workers"] > 0 for p in d.predictions), d.predictions
    assert d.proposal["settings"]["num_workers"] > 0
    assert d.cache["state"] != "yes", d.cache  # it reads a file: the cache only on that condition
    assert d.cache["proof"]["files"] == [records], d.cache


def test_batches_per_epoch_come_from_the_loader_not_the_dataset():
    # a sampler over an eighth of the dataset: the model must count 4 batches an epoch, not 32
    ds = dd.Cheap(n=512)
    d = fastcollate.doctor(ds, batch_size=16, epochs=1, verify=False, sampler=list(range(64)))
    assert "4 batches an epoch" in d.findings[0], d.findings
    bs = tud.BatchSampler(list(range(96)), 32, drop_last=False)  # and a batch sampler's batches
    d = fastcollate.doctor(ds, batch_size=1, epochs=1, verify=False, batch_sampler=bs)
    assert "per batch of 32 samples" in d.findings[0] and "3 batches an epoch" in d.findings[0], d.findings


@pytest.mark.parametrize("kw, msg", [(dict(drop_last=True, batch_size=64), "no batch"),
                                     (dict(batch_size=4, budget_s=-1), "budget_s"),
                                     (dict(batch_size=4, budget_s=0), "budget_s")])
def test_a_loop_with_no_batch_and_a_bad_budget_are_refused(kw, msg):
    with pytest.raises(ValueError, match=msg):
        fastcollate.doctor(dd.Cheap(n=10), **kw)


def test_io_bound_fetches_may_get_more_workers_than_cores():
    from fastcollate.tuning import model

    d = fastcollate.doctor(dd.Sleepy(n=128, wait=3e-3), batch_size=8, epochs=1, verify=False, num_workers=1)
    cores = d.load["cores_planned"]
    assert max(p["setting"]["num_workers"] for p in d.predictions) > cores, d.predictions
    assert any("wait" in f and "off the CPU" in f for f in d.findings), d.findings
    assert max(model.worker_counts(2, 0.0)) == 2


@pytest.mark.slow
def test_spawned_workers_are_not_started_again_in_the_measuring_rounds(tmp_path, monkeypatch):
    # a spawn context that is not persistent starts a new interpreter for every worker each epoch:
    # the rounds keep loaders started before them and charge the start-up the look measured
    import time

    log = tmp_path / "starts"
    monkeypatch.setenv("FASTCOLLATE_TEST_STARTS", str(log))
    marks: dict[str, float] = {}

    def progress(msg):
        marks.setdefault(msg.split(":")[0].split(",")[0].split(" and ")[0], time.monotonic())

    d = fastcollate.doctor(dd.Parsed(n=256, per_sample=50e-6), batch_size=32, epochs=2, num_workers=1,
                           multiprocessing_context="spawn", persistent_workers=False, worker_init_fn=dd.log_start,
                           progress=progress)
    starts = [float(t) for t in log.read_text().split()]
    assert d.baseline["measured"] and d.proposal["measured_samples_per_s"], d.baseline
    rounds = marks["measuring your settings"]
    assert starts and not [t for t in starts if t > rounds], (marks, starts)
    assert any(k.startswith("workers started by spawn") for k in marks), marks
    assert sum(t < marks["probing torch's DataLoader"] for t in starts) >= 2  # the look met them each epoch


def test_print_shows_the_report_and_the_rank(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("RANK", "3")
    d = fastcollate.doctor(dd.Cheap(n=64), batch_size=16, epochs=1, verify=False)
    text = str(d)
    assert text.startswith("\nbottleneck:") and "findings:" in text, text
    assert d.node["ranks"] == 2 and d.node["rank"] == 3
    assert any("rank 3 (local 1 of 2 on this node)" in f for f in d.findings), d.findings


def test_the_code_names_what_it_cannot_write():
    sampler = tud.RandomSampler(range(64))
    d = fastcollate.doctor(dd.Cheap(n=64), batch_size=16, epochs=1, verify=False, sampler=sampler,
                           worker_init_fn=lambda w: None, num_workers=1)
    code = d.code()
    assert "0x" not in code and "<lambda>" not in code, code
    assert "sampler = ...  # your RandomSampler" in code and "sampler=sampler" in code, code
    compile(code.replace("...", "None"), "<proposal>", "exec")
