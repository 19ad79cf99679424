// The engine's byte moves: many (src, dst, n) pieces copied into one arena, split across the
// pool's threads by bytes, and runs of one repeated element (pad values, masks). Knows nothing
// about Python; callers release the GIL around it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace fastcollate {

struct CopyPiece {
  const uint8_t* src;
  size_t dst_offset;  // into the arena
  size_t nbytes;
};

// nbytes at dst_offset filled with a repeated element (a pad value, a mask's 0 or 1).
struct FillPiece {
  size_t dst_offset;
  size_t nbytes;
  uint8_t pattern[16];
  uint8_t pattern_size;  // 1, 2, 4, 8 or 16; divides nbytes
};

void fill_pieces(const std::vector<FillPiece>& fills, uint8_t* base);

// nbytes at dst filled with copies of the item-byte element elem (item divides nbytes): the one
// element-repeat of the engine, for fill pieces and the gathers' padding and masks alike.
void fill_elements(uint8_t* dst, const uint8_t* elem, size_t item, size_t nbytes);

// Below this many bytes a copy stays on the calling thread: waking workers costs more.
constexpr size_t kParallelCopyMinBytes = 1 << 20;

// Copies every piece to base + dst_offset, using up to num_threads threads (the caller is one).
// stream_ok: a large batch may be written with non-temporal stores (see copy.cpp).
void copy_pieces(const std::vector<CopyPiece>& pieces, uint8_t* base, int num_threads, bool stream_ok = false);

}  // namespace fastcollate
