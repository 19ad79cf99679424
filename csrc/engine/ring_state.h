// The worker ring's slot states, in a small shared control block of int64 words that every
// process of a DataLoader maps: lock-free atomics work across processes on shared memory. ATen
// (the block is a tensor), no Python. The slots' tensors and leases: python/ring.cpp.
#pragma once

#include <ATen/core/Tensor.h>  // the Tensor class alone: ATen/ATen.h (every op) tripled the compile

#include <cstdint>
#include <vector>

namespace fastcollate {

// The control block's header words (exported to Python as _C.ring_words); slot i's state is
// word kRingHeader + i: 0 free, > 0 the pid of the worker that filled it, kRingHeldByMain held by
// the main process (its views, then -- for page-locked rings -- the copies still reading it).
enum RingWord : int64_t {
  kRingHits = 0,       // batches a worker collated into a slot
  kRingFull = 1,       // batches that found no free slot
  kRingOversize = 2,   // batches larger than a slot
  kRingBytes = 3,      // bytes collated into slots
  kRingCounters = 4,   // the counters above are words [0, kRingCounters)
  kRingSlots = 4,      // K, written once by the process that makes the ring
  kRingClaimHint = 5,  // where the next claim starts looking (spreads workers over the slots)
  kRingHeader = 8,     // header words; the slot states follow
};
constexpr int64_t kRingHeldByMain = -1;

// A free slot, taken for worker `tag` (its pid); -1 when none is free.
int64_t ring_claim(const at::Tensor& ctrl, int64_t tag);
// Moves slot's state from `from` to `to`; false when it was not `from`.
bool ring_transfer(const at::Tensor& ctrl, int64_t slot, int64_t from, int64_t to);
// Adds value to counter word `counter` (< kRingCounters).
void ring_add(const at::Tensor& ctrl, int64_t counter, int64_t value);
// Every slot's state.
std::vector<int64_t> ring_states(const at::Tensor& ctrl);
// Slot's state word (checked to be a slot of this ring).
int64_t ring_state(const at::Tensor& ctrl, int64_t slot);

}  // namespace fastcollate
