#include "engine/cache_state.h"

#include <atomic>

namespace fastcollate {
namespace {

static_assert(std::atomic<int64_t>::is_always_lock_free, "cross-process cache entries need lock-free atomics");

std::atomic<int64_t>* words(const at::Tensor& ctrl) {
  TORCH_CHECK(ctrl.device().is_cpu() && ctrl.scalar_type() == at::kLong && ctrl.is_contiguous() &&
                  ctrl.numel() >= kCacheHeader,
              "fastcollate cache: the control block must be a contiguous int64 CPU tensor of at least ", kCacheHeader,
              " words, got ", ctrl.scalar_type(), " ", ctrl.sizes(), " on ", ctrl.device());
  return reinterpret_cast<std::atomic<int64_t>*>(ctrl.data_ptr<int64_t>());
}

std::atomic<int64_t>* entry(const at::Tensor& ctrl, int64_t index) {
  std::atomic<int64_t>* w = words(ctrl);
  const int64_t n = w[kCacheEntries].load(std::memory_order_relaxed);
  TORCH_CHECK(n >= 0 && kCacheHeader + n * kCacheEntryWords <= ctrl.numel(),
              "fastcollate cache: corrupt control block (", n, " entries in ", ctrl.numel(), " words)");
  TORCH_CHECK(index >= 0 && index < n, "fastcollate cache: index ", index, " is outside the cache's ", n, " entries");
  return w + kCacheHeader + index * kCacheEntryWords;
}

int64_t aligned(int64_t nbytes) { return (nbytes + kCacheAlign - 1) / kCacheAlign * kCacheAlign; }

// What an entry typically takes: the mean published one, aligned; one alignment unit (the least
// any entry takes) while nothing is published.
int64_t typical_entry(std::atomic<int64_t>* w) {
  const int64_t inserts = w[kCacheInserts].load(std::memory_order_relaxed);
  if (inserts <= 0) return kCacheAlign;
  return aligned(w[kCachePayload].load(std::memory_order_relaxed) / inserts);
}

}  // namespace

int64_t cache_ctrl_words(int64_t entries) {
  TORCH_CHECK(entries >= 0, "fastcollate cache: a dataset of ", entries, " samples");
  return kCacheHeader + entries * kCacheEntryWords;
}

void cache_init(const at::Tensor& ctrl, int64_t entries, int64_t capacity) {
  TORCH_CHECK(capacity >= 0, "fastcollate cache: a data segment of ", capacity, " bytes");
  TORCH_CHECK(ctrl.numel() >= cache_ctrl_words(entries), "fastcollate cache: a control block of ", ctrl.numel(),
              " words cannot index ", entries, " entries (needs ", cache_ctrl_words(entries), ")");
  std::atomic<int64_t>* w = words(ctrl);
  w[kCacheCapacity].store(capacity);
  w[kCacheEntries].store(entries);
}

CacheSpan cache_find(const at::Tensor& ctrl, int64_t index) {
  std::atomic<int64_t>* e = entry(ctrl, index);
  // acquire: the offset, the length and the entry's bytes were written before the writer's release
  if (e[kEntryState].load(std::memory_order_acquire) != kEntryReady) return {-1, 0};
  return {e[kEntryOffset].load(std::memory_order_relaxed), e[kEntryLength].load(std::memory_order_relaxed)};
}

CacheClaimResult cache_claim(const at::Tensor& ctrl, int64_t index, int64_t tag) {
  TORCH_CHECK(tag > 0, "fastcollate cache: a claim tag must be a positive pid, got ", tag);
  std::atomic<int64_t>* e = entry(ctrl, index);
  int64_t state = e[kEntryState].load(std::memory_order_acquire);
  if (state == 0) {
    // a full cache inserts nothing more: the caller need not even serialize the sample
    if (words(ctrl)[kCacheFull].load(std::memory_order_relaxed) != 0) return {kClaimFull, 0};
    if (e[kEntryState].compare_exchange_strong(state, tag, std::memory_order_acq_rel)) return {kClaimed, 0};
  }
  if (state == kEntryReady) return {kClaimReady, 0};
  if (state == kEntryUncacheable || state == kEntryRefused) return {kClaimSkip, 0};
  return {kClaimBusy, state};
}

int64_t cache_reserve(const at::Tensor& ctrl, int64_t index, int64_t tag, int64_t nbytes) {
  TORCH_CHECK(nbytes > 0, "fastcollate cache: an entry of ", nbytes, " bytes");
  std::atomic<int64_t>* w = words(ctrl);
  std::atomic<int64_t>* e = entry(ctrl, index);
  TORCH_CHECK(e[kEntryState].load() == tag, "fastcollate cache: entry ", index, " is not held by pid ", tag,
              " (state ", e[kEntryState].load(), ")");
  const int64_t capacity = w[kCacheCapacity].load(std::memory_order_relaxed);
  const int64_t need = aligned(nbytes);
  int64_t top = w[kCacheTop].load();
  // a CAS loop rather than fetch_add: the top never passes the capacity, so a refused insert
  // leaves no hole that a smaller one could not have used
  while (true) {
    if (need > capacity - top) {
      w[kCacheRefusedFull].fetch_add(1);
      if (capacity - top < typical_entry(w)) w[kCacheFull].store(1);
      int64_t held = tag;
      e[kEntryState].compare_exchange_strong(held, kEntryRefused);
      return -1;
    }
    if (w[kCacheTop].compare_exchange_weak(top, top + need)) return top;
  }
}

bool cache_publish(const at::Tensor& ctrl, int64_t index, int64_t tag, int64_t offset, int64_t nbytes) {
  std::atomic<int64_t>* w = words(ctrl);
  std::atomic<int64_t>* e = entry(ctrl, index);
  TORCH_CHECK(offset >= 0 && nbytes > 0 && offset % kCacheAlign == 0 &&
                  offset + nbytes <= w[kCacheTop].load(std::memory_order_relaxed),
              "fastcollate cache: entry ", index, " at byte ", offset, " of ", nbytes,
              " bytes was not reserved (allocator top ", w[kCacheTop].load(), ")");
  // only the holder writes these words, and no reader looks at them before the state says ready
  e[kEntryOffset].store(offset, std::memory_order_relaxed);
  e[kEntryLength].store(nbytes, std::memory_order_relaxed);
  int64_t held = tag;
  // release: everything the writer stored (the entry's bytes, the words above) is visible to a
  // reader that sees kEntryReady
  if (!e[kEntryState].compare_exchange_strong(held, kEntryReady, std::memory_order_acq_rel)) return false;
  w[kCacheInserts].fetch_add(1);
  w[kCachePayload].fetch_add(nbytes);
  return true;
}

bool cache_release(const at::Tensor& ctrl, int64_t index, int64_t from, int64_t to, bool reclaimed) {
  TORCH_CHECK(from > 0, "fastcollate cache: only a writer's claim (a pid) is released, got state ", from);
  TORCH_CHECK(to == 0 || to == kEntryUncacheable, "fastcollate cache: a claim is released to empty (0) or ",
              kEntryUncacheable, " (uncacheable), got ", to);
  std::atomic<int64_t>* e = entry(ctrl, index);
  int64_t held = from;
  if (!e[kEntryState].compare_exchange_strong(held, to)) return false;
  if (reclaimed) words(ctrl)[kCacheReclaimed].fetch_add(1);
  if (to == kEntryUncacheable) words(ctrl)[kCacheUncacheable].fetch_add(1);
  return true;
}

void cache_add(const at::Tensor& ctrl, int64_t counter, int64_t value) {
  TORCH_CHECK(counter >= 0 && counter < kCacheCounters, "fastcollate cache: no counter ", counter);
  words(ctrl)[counter].fetch_add(value, std::memory_order_relaxed);
}

int64_t cache_state(const at::Tensor& ctrl, int64_t index) { return entry(ctrl, index)[kEntryState].load(); }

}  // namespace fastcollate
