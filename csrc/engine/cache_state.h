// The sample cache's index (fastcollate.Cached), in a shared control block of int64 words that
// every process of a DataLoader maps: per dataset index an entry that is empty, being written by
// one process (its pid), or published (an offset and a length in the data segment); a bump
// allocator over the data segment that refuses once it is full; shared counters. ATen (the block
// is a tensor), no Python, GIL-free: lock-free atomics work across processes on shared memory.
// What the bytes of an entry mean (a pickled sample): fastcollate/data/cache.py.
//
// The protocol. A writer claims an empty entry (CAS 0 -> its pid), reserves bytes (the
// allocator), writes them, then publishes (offset and length stored, then the state CAS pid ->
// kEntryReady with release ordering). A reader loads the state with acquire ordering: published,
// or a miss -- it never waits. A published entry never changes again (nothing is evicted), so a
// reader's bytes stay valid for the life of the segment. A writer that gives up (its sample could
// not be stored) releases the entry back to empty, or marks it kEntryUncacheable; an entry whose
// writer died is reclaimed (CAS dead pid -> 0) by whoever finds it so; what that writer reserved
// stays allocated (counted in the allocator's top).
//
// The full rule. The room left (capacity - top) only ever shrinks: nothing is evicted. A
// reservation that does not fit is refused alone -- its entry becomes kEntryRefused, never tried
// again, since it could not fit later either -- and smaller samples keep being inserted. The cache
// is marked full (kCacheFull: claims are refused before anyone serializes a sample) when a
// refusal finds the room left smaller than a typical entry: the mean published entry, 64-byte
// aligned, or one alignment unit while nothing is published (then nothing at all fits).
#pragma once

#include <ATen/core/Tensor.h>  // the Tensor class alone: ATen/ATen.h (every op) tripled the compile

#include <cstdint>

namespace fastcollate {

// The control block's header words (exported to Python as _C.cache_words).
enum CacheWord : int64_t {
  kCacheHits = 0,          // lookups that found a published entry
  kCacheMisses = 1,        // lookups that did not (the sample came from the dataset)
  kCacheInserts = 2,       // entries published
  kCachePayload = 3,       // bytes of the published entries
  kCacheRefusedFull = 4,   // inserts refused because the data segment was full
  kCacheUncacheable = 5,   // indices whose sample cannot be stored exactly (marked once each)
  kCacheReclaimed = 6,     // entries taken back from writers that died
  kCacheHitNs = 7,         // time spent serving hits (deserialization and copies), ns
  kCacheFetchNs = 8,       // time spent fetching misses from the dataset, ns
  kCacheInsertNs = 9,      // time spent serializing and writing inserts, ns
  kCacheTransformNs = 10,  // time spent in the wrapper's transform, ns
  kCacheCounters = 11,     // the counters above are words [0, kCacheCounters)
  kCacheEntries = 12,      // N, the number of indices (written once by the process that makes it)
  kCacheCapacity = 13,     // bytes of the data segment (written once)
  kCacheTop = 14,          // the allocator: bytes of the data segment handed out so far
  kCacheFull = 15,         // 1 once a refused insert found less room than a typical entry: no more inserts
  kCacheHeader = 16,       // header words; the entries follow
};

// Entry i is the kCacheEntryWords words at kCacheHeader + i * kCacheEntryWords.
enum CacheEntryWord : int64_t {
  kEntryState = 0,   // 0 empty, > 0 the pid writing it, kEntryReady, kEntryUncacheable, kEntryRefused
  kEntryOffset = 1,  // byte offset in the data segment (valid once ready)
  kEntryLength = 2,  // bytes (valid once ready)
  kCacheEntryWords = 3,
};
constexpr int64_t kEntryReady = -1;
constexpr int64_t kEntryUncacheable = -2;
constexpr int64_t kEntryRefused = -3;  // its sample did not fit the room left (never tried again)
constexpr int64_t kCacheAlign = 64;  // every entry starts at a multiple of this in the data segment

// What a writer's claim found.
enum CacheClaim : int64_t {
  kClaimed = 0,      // the entry is the caller's to write
  kClaimReady = 1,   // already published (by someone else, meanwhile)
  kClaimBusy = 2,    // another writer holds it (its pid in `holder`)
  kClaimFull = 3,    // the cache is full: nothing is inserted any more
  kClaimSkip = 4,    // marked uncacheable, or refused as too big for the room left
};

struct CacheClaimResult {
  int64_t outcome;  // a CacheClaim
  int64_t holder;   // the writer's pid when busy, else 0
};

struct CacheSpan {
  int64_t offset;  // byte offset in the data segment, -1 when not published
  int64_t length;
};

// Lays out a zeroed control block for `entries` indices over a data segment of `capacity` bytes.
void cache_init(const at::Tensor& ctrl, int64_t entries, int64_t capacity);
// Control block words for `entries` indices.
int64_t cache_ctrl_words(int64_t entries);
// Entry `index`'s bytes when it is published ({-1, 0} otherwise); never waits.
CacheSpan cache_find(const at::Tensor& ctrl, int64_t index);
// Entry `index` for writer `tag` (a positive pid).
CacheClaimResult cache_claim(const at::Tensor& ctrl, int64_t index, int64_t tag);
// nbytes of the data segment for the entry `tag` holds: the offset, or -1 when they do not fit --
// the entry is then kEntryRefused, and the cache marked full when the room left is smaller than a
// typical entry (the full rule above).
int64_t cache_reserve(const at::Tensor& ctrl, int64_t index, int64_t tag, int64_t nbytes);
// Publishes the entry `tag` holds at offset/nbytes (reserved by it); false when it no longer held it.
bool cache_publish(const at::Tensor& ctrl, int64_t index, int64_t tag, int64_t offset, int64_t nbytes);
// Moves entry `index` from `from` (a writer's pid) to empty (0) or kEntryUncacheable; false when it
// was not `from`. `reclaimed`: `from` is a dead writer (counted).
bool cache_release(const at::Tensor& ctrl, int64_t index, int64_t from, int64_t to, bool reclaimed);
// Adds value to counter word `counter` (< kCacheCounters).
void cache_add(const at::Tensor& ctrl, int64_t counter, int64_t value);
// Entry `index`'s state word.
int64_t cache_state(const at::Tensor& ctrl, int64_t index);

}  // namespace fastcollate
