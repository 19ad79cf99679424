#include "engine/transpose.h"

#include <algorithm>
#include <cstring>

#include "engine/copy.h"
#include "engine/pool.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define FASTCOLLATE_X86 1
#endif

namespace fastcollate {
namespace {

// Tiles small enough that the source rows of one tile stay in L1 while it is written.
constexpr int64_t kTile = 64;

template <typename T>
void transpose_blocked(const TransposePiece& p, uint8_t* base) {
  const T* src = reinterpret_cast<const T*>(p.src);
  T* dst = reinterpret_cast<T*>(base + p.dst_offset);
  for (int64_t c0 = 0; c0 < p.cols; c0 += kTile) {
    const int64_t c1 = std::min(p.cols, c0 + kTile);
    for (int64_t r0 = 0; r0 < p.rows; r0 += kTile) {
      const int64_t r1 = std::min(p.rows, r0 + kTile);
      for (int64_t r = r0; r < r1; ++r) {
        const T* s = src + r * p.row_stride;
        T* d = dst + r * p.cols;
        for (int64_t c = c0; c < c1; ++c) d[c] = s[c * p.col_stride];
      }
    }
  }
}

// HWC uint8 with 3 channels -> 3 planes: the common image case, 16 pixels per step.
void deinterleave3_scalar(const uint8_t* s, uint8_t* d0, uint8_t* d1, uint8_t* d2, int64_t n, int64_t from) {
  for (int64_t i = from; i < n; ++i) {
    d0[i] = s[3 * i];
    d1[i] = s[3 * i + 1];
    d2[i] = s[3 * i + 2];
  }
}

#ifdef FASTCOLLATE_X86
__attribute__((target("ssse3"))) void deinterleave3_ssse3(const uint8_t* s, uint8_t* d0, uint8_t* d1, uint8_t* d2,
                                                          int64_t n) {
  // byte k of plane j comes from input byte 3k + j of the 48 bytes a|b|c; -1 (0x80) zeroes
  auto mask = [](int j, int part) {
    alignas(16) int8_t m[16];
    for (int k = 0; k < 16; ++k) {
      const int at = 3 * k + j - 16 * part;
      m[k] = (at >= 0 && at < 16) ? static_cast<int8_t>(at) : static_cast<int8_t>(-128);
    }
    return _mm_load_si128(reinterpret_cast<const __m128i*>(m));
  };
  const __m128i m00 = mask(0, 0), m01 = mask(0, 1), m02 = mask(0, 2);
  const __m128i m10 = mask(1, 0), m11 = mask(1, 1), m12 = mask(1, 2);
  const __m128i m20 = mask(2, 0), m21 = mask(2, 1), m22 = mask(2, 2);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 3 * i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 3 * i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 3 * i + 32));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d0 + i),
                     _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(a, m00), _mm_shuffle_epi8(b, m01)), _mm_shuffle_epi8(c, m02)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d1 + i),
                     _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(a, m10), _mm_shuffle_epi8(b, m11)), _mm_shuffle_epi8(c, m12)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d2 + i),
                     _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(a, m20), _mm_shuffle_epi8(b, m21)), _mm_shuffle_epi8(c, m22)));
  }
  deinterleave3_scalar(s, d0, d1, d2, n, i);
}

bool have_ssse3() {
  static const bool yes = __builtin_cpu_supports("ssse3");
  return yes;
}

__attribute__((target("ssse3"))) void reverse_ssse3(uint8_t* d, int64_t n) {
  const __m128i back = _mm_setr_epi8(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  int64_t i = 0, j = n;
  for (; j - i >= 32; i += 16, j -= 16) {  // swap the 16 bytes at each end, each reversed
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(d + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(d + j - 16));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), _mm_shuffle_epi8(b, back));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + j - 16), _mm_shuffle_epi8(a, back));
  }
  std::reverse(d + i, d + j);
}
#endif

void deinterleave3(const uint8_t* s, uint8_t* d0, uint8_t* d1, uint8_t* d2, int64_t n) {
#ifdef FASTCOLLATE_X86
  if (have_ssse3()) return deinterleave3_ssse3(s, d0, d1, d2, n);
#endif
  deinterleave3_scalar(s, d0, d1, d2, n, 0);
}

void reverse_bytes(uint8_t* d, int64_t n) {
#ifdef FASTCOLLATE_X86
  if (have_ssse3()) return reverse_ssse3(d, n);
#endif
  std::reverse(d, d + n);
}

void run_piece(const TransposePiece& p, uint8_t* base) {
  if (p.elem_size == 1 && p.rows == 3 && p.row_stride == 1 && p.col_stride == 3) {
    uint8_t* d = base + p.dst_offset;
    return deinterleave3(p.src, d, d + p.cols, d + 2 * p.cols, p.cols);
  }
  switch (p.elem_size) {
    case 1: return transpose_blocked<uint8_t>(p, base);
    case 2: return transpose_blocked<uint16_t>(p, base);
    case 4: return transpose_blocked<uint32_t>(p, base);
    default: return transpose_blocked<uint64_t>(p, base);
  }
}

}  // namespace

void hwc3_to_chw(const uint8_t* src, int64_t row_stride, int64_t rows, int64_t cols, uint8_t* dst, bool flip) {
  const int64_t plane = rows * cols;
  if (!flip && row_stride == 3 * cols) return deinterleave3(src, dst, dst + plane, dst + 2 * plane, plane);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* d = dst + r * cols;
    deinterleave3(src + r * row_stride, d, d + plane, d + 2 * plane, cols);
    if (flip) {
      for (int c = 0; c < 3; ++c) reverse_bytes(d + c * plane, cols);
    }
  }
}

bool as_transpose(const int64_t* sizes, const int64_t* strides, int ndim, size_t elem_size, TransposePiece* out) {
  if (elem_size != 1 && elem_size != 2 && elem_size != 4 && elem_size != 8) return false;
  int64_t sz[2], st[2];
  int n = 0;
  for (int d = 0; d < ndim; ++d) {
    if (sizes[d] == 1) continue;
    if (sizes[d] == 0 || strides[d] <= 0) return false;
    if (n > 0 && st[n - 1] == strides[d] * sizes[d]) {  // contiguous in the source: one dim
      sz[n - 1] *= sizes[d];
      st[n - 1] = strides[d];
      continue;
    }
    if (n == 2) return false;
    sz[n] = sizes[d];
    st[n] = strides[d];
    ++n;
  }
  if (n != 2) return false;
  *out = TransposePiece{nullptr, 0, sz[0], sz[1], st[0], st[1], static_cast<uint8_t>(elem_size)};
  return true;
}

void transpose_pieces(const std::vector<TransposePiece>& pieces, uint8_t* base, int num_threads) {
  if (pieces.empty()) return;
  size_t total = 0;
  for (const auto& p : pieces) total += static_cast<size_t>(p.rows * p.cols) * p.elem_size;
  int threads = std::max(1, std::min<int>(num_threads, static_cast<int>(pieces.size())));
  if (total < kParallelCopyMinBytes) threads = 1;
  parallel_run(static_cast<int>(pieces.size()), [&](int i) { run_piece(pieces[i], base); }, threads);
}

}  // namespace fastcollate
