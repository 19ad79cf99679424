// Strided sources that are a transpose of a dense block -- a CHW view of HWC memory, what
// torchvision's PILToTensor / ToImage return -- copied into the contiguous arena by the engine
// itself: threaded, GIL released, cache-blocked. Knows nothing about Python or ATen.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace fastcollate {

// dst[r * cols + c] = src[r * row_stride + c * col_stride] (strides in elements), dst at
// arena + dst_offset, elements of elem_size bytes (1, 2, 4 or 8).
struct TransposePiece {
  const uint8_t* src;
  size_t dst_offset;
  int64_t rows, cols;
  int64_t row_stride, col_stride;
  uint8_t elem_size;
};

// Describes a copy of a strided source of `ndim` dims into a contiguous block as one 2-D
// transpose, after dropping size-1 dims and merging dims that are contiguous in the source:
// true and *out filled (src and dst_offset left to the caller), or false.
bool as_transpose(const int64_t* sizes, const int64_t* strides, int ndim, size_t elem_size, TransposePiece* out);

// rows x cols pixels of 3-channel uint8 HWC at src (row_stride bytes apart) into the 3 planes of
// a contiguous CHW block at dst, each row reversed if flip: the image stage's last step.
void hwc3_to_chw(const uint8_t* src, int64_t row_stride, int64_t rows, int64_t cols, uint8_t* dst, bool flip);

// Runs every piece, spread over up to num_threads threads (the caller is one).
void transpose_pieces(const std::vector<TransposePiece>& pieces, uint8_t* base, int num_threads);

}  // namespace fastcollate
