// The Python entry points of collate (GIL held): the walk into a plan, the arena, the engine's
// copies with the GIL released, the containers rebuilt around views; and the counters of
// fastcollate.stats().
#include <torch/csrc/utils/pybind.h>

#include <atomic>
#include <optional>

#include "bindings/register.h"
#include "python/nogil.h"
#include "engine/arena_pool.h"
#include "engine/gather_rows.h"
#include "python/leaves.h"
#include "python/pad.h"
#include "python/plan.h"

namespace fastcollate {

at::Tensor checked_arena(py::handle alloc_fn, size_t nbytes) {
  at::Tensor arena = py::reinterpret_borrow<py::object>(alloc_fn)(nbytes).cast<at::Tensor>();
  TORCH_CHECK(arena.device().is_cpu() && arena.scalar_type() == at::kByte && arena.dim() == 1 &&
                  arena.is_contiguous() && static_cast<size_t>(arena.numel()) >= nbytes,
              "fastcollate: the arena allocator must return a contiguous 1-D uint8 CPU tensor of at least ",
              nbytes, " bytes; got ", arena.scalar_type(), " of shape ", arena.sizes(), " on ", arena.device());
  TORCH_CHECK(nbytes == 0 || reinterpret_cast<uintptr_t>(arena.data_ptr()) % kLeafAlign == 0,
              "fastcollate: the arena must be ", kLeafAlign, "-byte aligned");
  return arena;
}

namespace {

std::atomic<uint64_t> g_batches{0}, g_bytes{0}, g_leaves{0}, g_deferred{0};

// One batch: walk (GIL held), allocate the arena, copy (GIL released), rebuild (GIL held).
// alloc_fn is None for the pageable pool, else a callable nbytes -> uint8 tensor.
py::object collate(py::handle batch, py::handle alloc_fn, int num_threads, py::handle defer_fn, py::handle pad_spec,
                   bool in_main) {
  std::optional<PadConfig> pad;
  if (!pad_spec.is_none()) pad = PadConfig::parse(pad_spec);
  // in_main: not in a DataLoader worker -- torch.stack's memory formats, streamed stores
  Plan plan = build_plan(batch, defer_fn, pad ? &*pad : nullptr, in_main);
  at::Tensor arena;
  if (plan.tensor_leaves > 0) {
    arena = alloc_fn.is_none() ? pool_allocate(plan.nbytes) : checked_arena(alloc_fn, plan.nbytes);
    NoGil no_gil;
    run_copies(plan, arena, num_threads, in_main);
  }
  py::object out = assemble(plan, arena, batch);
  g_batches.fetch_add(1, std::memory_order_relaxed);
  g_bytes.fetch_add(plan.nbytes, std::memory_order_relaxed);
  g_leaves.fetch_add(plan.tensor_leaves, std::memory_order_relaxed);
  g_deferred.fetch_add(plan.deferred, std::memory_order_relaxed);
  return out;
}

// The arena bytes a batch would need (the walk alone; nothing is allocated or copied).
size_t plan_bytes(py::handle batch, py::handle defer_fn, py::handle pad_spec) {
  std::optional<PadConfig> pad;
  if (!pad_spec.is_none()) pad = PadConfig::parse(pad_spec);
  return build_plan(batch, defer_fn, pad ? &*pad : nullptr).nbytes;
}

py::dict stats() {
  const PoolStats p = pool_stats();
  py::dict d;
  d["batches"] = g_batches.load();
  d["bytes"] = g_bytes.load();
  d["tensor_leaves"] = g_leaves.load();
  d["deferred_leaves"] = g_deferred.load();
  d["gathered_batches"] = g_gathered_batches.load();
  d["arenas_allocated"] = p.allocated;
  d["arenas_reused"] = p.reused;
  d["arenas_unpooled"] = p.unpooled;
  d["arenas_evicted"] = p.evicted;
  d["arenas_in_use"] = p.in_use;
  d["pool_bytes"] = p.pool_bytes;
  d["pool_idle_bytes"] = p.idle_bytes;
  d["pool_limit_bytes"] = p.limit_bytes;
  return d;
}

void reset_counters() {
  g_batches = 0;
  g_bytes = 0;
  g_leaves = 0;
  g_deferred = 0;
  g_gathered_batches = 0;
}

}  // namespace

void register_collate(pybind11::module_& m) {
  m.def("numpy_structs", &numpy_structs,
        "Whether numpy leaves are read from numpy's structs (the module was built with numpy's headers).");
  m.def("collate", &collate, py::arg("batch"), py::arg("alloc_fn"), py::arg("num_threads"), py::arg("defer_fn"),
        py::arg("pad") = py::none(), py::arg("in_main") = true);
  m.def("stats", &stats);
  m.def("plan_bytes", &plan_bytes, py::arg("batch"), py::arg("defer_fn"), py::arg("pad") = py::none());
  m.def("reset_counters", &reset_counters);
}

}  // namespace fastcollate
