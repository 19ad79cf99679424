// What each file of the module binds: bindings/module.cpp calls these, and nothing else.
#pragma once

#include <pybind11/pybind11.h>

namespace fastcollate {

void register_collate(pybind11::module_& m);       // python/collate.cpp: collate, plan_bytes, stats
void register_engine_ops(pybind11::module_& m);    // python/engine_ops.cpp: the arena pool, raw copies
void register_gather_ops(pybind11::module_& m);    // python/gather.cpp: the planned gather
void register_fixed_gather(pybind11::module_& m);  // python/gather_fixed.cpp: FixedGather
void register_ring_ops(pybind11::module_& m);      // python/ring.cpp: slot claims, leases, views
void register_cache_ops(pybind11::module_& m);     // python/cache.cpp: the sample cache's entries and counters
void register_image_ops(pybind11::module_& m);     // python/images.cpp: file reads, JPEG headers and decodes, image batches
void register_exit_gate(pybind11::module_& m);     // python/exit_gate.cpp: the engine closed at interpreter exit
#if FASTCOLLATE_WITH_CUDA
void register_host_ops(pybind11::module_& m);      // cuda/host_register.cpp: page-locking
#endif

}  // namespace fastcollate
