#include "engine/copy.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "engine/pool.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <emmintrin.h>
#define FASTCOLLATE_STREAM_STORES 1
#endif

namespace fastcollate {
namespace {

// Batches larger than the caches are written once and read later by someone else (the H2D
// copy, the model): non-temporal stores skip reading every destination line in first
// (write-allocate), as glibc's memcpy does for one large block -- but not for the many
// medium pieces of a batch, each under its threshold. Only in the main process: a worker's
// first batches land on fresh pages of its ring slot, and there streaming is slower (a new
// loader's first epoch loses its lead over torch's).
constexpr size_t kStreamMinTotalDefault = 8 << 20;

// FASTCOLLATE_STREAM_BYTES overrides the threshold (0: never stream), for A/B runs
size_t stream_min_total() {
  static const size_t value = [] {
    const char* env = std::getenv("FASTCOLLATE_STREAM_BYTES");
    if (env == nullptr || *env == 0) return kStreamMinTotalDefault;
    const unsigned long long v = std::strtoull(env, nullptr, 10);
    return v == 0 ? SIZE_MAX : static_cast<size_t>(v);
  }();
  return value;
}
constexpr size_t kStreamMinPiece = 4 << 10;

void stream_copy(uint8_t* dst, const uint8_t* src, size_t n) {
#ifdef FASTCOLLATE_STREAM_STORES
  const size_t head = (16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15;
  if (n < head + 64) {
    std::memcpy(dst, src, n);
    return;
  }
  std::memcpy(dst, src, head);
  dst += head;
  src += head;
  n -= head;
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  std::memcpy(dst + i, src + i, n - i);
#else
  std::memcpy(dst, src, n);
#endif
}

void copy_range(uint8_t* dst, const uint8_t* src, size_t n, bool stream) {
  if (stream && n >= kStreamMinPiece) stream_copy(dst, src, n);
  else std::memcpy(dst, src, n);
}

void store_fence(bool stream) {
#ifdef FASTCOLLATE_STREAM_STORES
  if (stream) _mm_sfence();  // streamed stores are visible to other threads only after a fence
#endif
}

}  // namespace

void copy_pieces(const std::vector<CopyPiece>& pieces, uint8_t* base, int num_threads, bool stream_ok) {
  size_t total = 0;
  for (const auto& p : pieces) total += p.nbytes;
  int threads = std::max(1, num_threads);
  if (total < kParallelCopyMinBytes) threads = 1;
  threads = static_cast<int>(std::min<size_t>(threads, std::max<size_t>(1, total / (kParallelCopyMinBytes / 2))));
  const bool stream = stream_ok && total >= stream_min_total();
  if (threads == 1) {
    for (const auto& p : pieces) copy_range(base + p.dst_offset, p.src, p.nbytes, stream);
    store_fence(stream);
    return;
  }
  // Thread t copies bytes [t*share, (t+1)*share) of the concatenated pieces, cutting pieces at
  // the boundaries, so every thread moves the same number of bytes whatever the piece sizes.
  std::vector<size_t> starts(pieces.size() + 1, 0);  // starts[i]: bytes before piece i
  for (size_t i = 0; i < pieces.size(); ++i) starts[i + 1] = starts[i] + pieces[i].nbytes;
  // kTasksPerThread tasks per thread, claimed as threads come free (see parallel_run)
  const int tasks = threads * kTasksPerThread;
  const size_t share = (total + tasks - 1) / tasks;
  parallel_run(tasks, [&](int t) {
    const size_t lo = std::min(total, share * t);
    const size_t hi = std::min(total, share * (t + 1));
    // the last piece that starts at or before lo
    size_t i = static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), lo) - starts.begin()) - 1;
    for (size_t pos = lo; pos < hi && i < pieces.size(); ++i) {
      const CopyPiece& p = pieces[i];
      const size_t skip = pos - starts[i];
      const size_t n = std::min(p.nbytes - skip, hi - pos);
      copy_range(base + p.dst_offset + skip, p.src + skip, n, stream);
      pos += n;
    }
    store_fence(stream);
  }, threads);
}

void fill_elements(uint8_t* dst, const uint8_t* elem, size_t item, size_t nbytes) {
  if (nbytes == 0) return;
  bool uniform = true;  // all element bytes equal (0, -1, 1 as bool...): one memset
  for (size_t i = 1; i < item; ++i) uniform = uniform && elem[i] == elem[0];
  if (uniform) {
    std::memset(dst, elem[0], nbytes);
    return;
  }
  // one element, then the filled prefix copied onto the rest, doubling: log2(n) memcpys
  std::memcpy(dst, elem, item);
  size_t done = item;
  while (done < nbytes) {
    const size_t n = std::min(done, nbytes - done);
    std::memcpy(dst + done, dst, n);
    done += n;
  }
}

void fill_pieces(const std::vector<FillPiece>& fills, uint8_t* base) {
  for (const FillPiece& f : fills) fill_elements(base + f.dst_offset, f.pattern, f.pattern_size, f.nbytes);
}

}  // namespace fastcollate
