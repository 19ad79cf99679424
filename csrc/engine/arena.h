// A batch's arena: where its leaves sit (64-byte aligned offsets), the writes that fill it --
// every route (memcpy pieces, transposes, fills, ATen conversions) -- and views of it. ATen,
// no Python: run_copies is called with the GIL released.
#pragma once

#include <ATen/core/Tensor.h>  // the Tensor class alone: ATen/ATen.h (every op) tripled the compile

#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/copy.h"
#include "engine/transpose.h"

namespace fastcollate {

// Every leaf starts at a multiple of this in its arena (exported to Python as _C.align).
constexpr size_t kLeafAlign = 64;

// A copy that memcpy cannot do: a strided or conjugated source, or a dtype conversion.
struct Conversion {
  at::Tensor src;
  at::ScalarType dtype;
  std::vector<int64_t> sizes;
  size_t dst_offset;
  std::vector<int64_t> strides = {};  // of the destination view; empty: contiguous
};

// The writes of one batch into its arena, by route.
struct ArenaWrites {
  std::vector<CopyPiece> pieces;
  std::vector<Conversion> conversions;
  std::vector<TransposePiece> transposes;
  std::vector<FillPiece> fills;
};

// Runs every write into the arena. Touches no Python object: call with the GIL released.
// stream_ok: large batches may use non-temporal stores (the main process's arenas).
void run_copies(const ArenaWrites& writes, const at::Tensor& arena, int num_threads, bool stream_ok = false);

// A view of the arena: dtype, sizes (contiguous, or the given strides), at a byte offset.
at::Tensor arena_view(const at::Tensor& arena, size_t offset, at::ScalarType dtype, c10::IntArrayRef sizes,
                      c10::IntArrayRef strides = {});

}  // namespace fastcollate
