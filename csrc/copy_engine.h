// The threaded byte copy: many (src, dst, n) pieces into one arena, split across threads by
// bytes. Knows nothing about Python; callers release the GIL around it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
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

// Below this many bytes a copy stays on the calling thread: waking workers costs more.
constexpr size_t kParallelCopyMinBytes = 1 << 20;

// Copies every piece to base + dst_offset, using up to num_threads threads (the caller is one).
// stream_ok: a large batch may be written with non-temporal stores (see copy_engine.cpp).
void copy_pieces(const std::vector<CopyPiece>& pieces, uint8_t* base, int num_threads, bool stream_ok = false);

// Runs fn(0) .. fn(ntasks - 1) on the shared pool with up to max_threads threads (<= 0: one per
// task), the calling thread taking part; each thread claims the next unclaimed task, so split
// work into more tasks than threads and a slow-to-wake helper costs nothing. Returns when all
// have finished; the first exception thrown by a task is rethrown here.
void parallel_run(int ntasks, const std::function<void(int)>& fn, int max_threads = 0);

// Tasks per thread that the copies split their bytes into.
constexpr int kTasksPerThread = 8;

int hardware_threads();
// The cores this process may run on (its affinity mask, read once).
int usable_cores();

}  // namespace fastcollate
