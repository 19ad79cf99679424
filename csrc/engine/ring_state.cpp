#include "engine/ring_state.h"

#include <atomic>

namespace fastcollate {
namespace {

static_assert(std::atomic<int64_t>::is_always_lock_free, "cross-process slot states need lock-free atomics");

std::atomic<int64_t>* words(const at::Tensor& ctrl) {
  TORCH_CHECK(ctrl.device().is_cpu() && ctrl.scalar_type() == at::kLong && ctrl.is_contiguous() &&
                  ctrl.numel() >= kRingHeader,
              "fastcollate ring: the control block must be a contiguous int64 CPU tensor");
  return reinterpret_cast<std::atomic<int64_t>*>(ctrl.data_ptr<int64_t>());
}

int64_t slots(const at::Tensor& ctrl) {
  const int64_t k = words(ctrl)[kRingSlots].load();
  TORCH_CHECK(k >= 0 && kRingHeader + k <= ctrl.numel(), "fastcollate ring: corrupt control block");
  return k;
}

std::atomic<int64_t>& state(const at::Tensor& ctrl, int64_t slot) {
  TORCH_CHECK(slot >= 0 && slot < slots(ctrl), "fastcollate ring: slot ", slot, " out of range");
  return words(ctrl)[kRingHeader + slot];
}

}  // namespace

int64_t ring_claim(const at::Tensor& ctrl, int64_t tag) {
  TORCH_CHECK(tag > 0, "fastcollate ring: a claim tag must be a positive pid");
  std::atomic<int64_t>* w = words(ctrl);
  const int64_t k = slots(ctrl);
  if (k == 0) return -1;
  const int64_t start = w[kRingClaimHint].fetch_add(1) % k;  // spread workers over the slots
  for (int64_t j = 0; j < k; ++j) {
    const int64_t i = (start + j) % k;
    int64_t expected = 0;
    if (w[kRingHeader + i].compare_exchange_strong(expected, tag)) return i;
  }
  return -1;
}

bool ring_transfer(const at::Tensor& ctrl, int64_t slot, int64_t from, int64_t to) {
  int64_t expected = from;
  return state(ctrl, slot).compare_exchange_strong(expected, to);
}

void ring_add(const at::Tensor& ctrl, int64_t counter, int64_t value) {
  TORCH_CHECK(counter >= 0 && counter < kRingCounters, "fastcollate ring: no counter ", counter);
  words(ctrl)[counter].fetch_add(value);
}

std::vector<int64_t> ring_states(const at::Tensor& ctrl) {
  std::vector<int64_t> out(slots(ctrl));
  for (size_t i = 0; i < out.size(); ++i) out[i] = words(ctrl)[kRingHeader + i].load();
  return out;
}

int64_t ring_state(const at::Tensor& ctrl, int64_t slot) { return state(ctrl, slot).load(); }

}  // namespace fastcollate
