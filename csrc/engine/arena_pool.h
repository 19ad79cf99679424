// Recycled pageable arenas. A batch's arena goes back to the pool only when the storage that
// owns it dies (its DataPtr deleter runs), i.e. after the last view into it is gone, so a
// recycled arena is never one that something can still read. Most of a fresh allocation's
// cost is page-faulting it; reuse skips that.
#pragma once

#include <ATen/core/Tensor.h>  // the Tensor class alone: ATen/ATen.h (every op) tripled the compile

#include <cstddef>
#include <cstdint>

namespace fastcollate {

struct PoolStats {
  uint64_t allocated = 0;    // fresh pooled arenas (misses)
  uint64_t reused = 0;       // arenas served from the idle list (hits)
  uint64_t unpooled = 0;     // arenas made outside the pool because the cap was reached
  uint64_t evicted = 0;      // idle arenas freed to make room under the cap
  uint64_t pool_bytes = 0;   // bytes the pool owns (in use + idle)
  uint64_t idle_bytes = 0;   // of which idle, ready for reuse
  uint64_t in_use = 0;       // arenas handed out and not yet returned (pooled and unpooled)
  uint64_t limit_bytes = 0;  // the cap on pool_bytes
};

// A 1-D uint8 CPU tensor of at least nbytes, 4096-byte aligned, owned by the pool.
at::Tensor pool_allocate(size_t nbytes);
// The size an arena of nbytes is rounded to (its size class).
size_t pool_size_class(size_t nbytes);
void pool_set_limit(size_t bytes);
PoolStats pool_stats();
// Frees every idle arena; arenas in use are freed when they come back.
void pool_trim();

}  // namespace fastcollate
