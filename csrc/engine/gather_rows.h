// The gathers' row jobs: indexed rows of columns already in memory (numpy arrays, memmaps,
// tensors, Arrow buffers) moved and converted into a batch's arena, with padding, masks and
// lengths. Shared by the planned-in-Python gather (python/gather.cpp) and the compiled template
// of fixed-row datasets (python/gather_fixed.cpp), which build the jobs with the GIL held; this
// runs them without it, on the pool.
#pragma once

#include <ATen/core/Tensor.h>  // the Tensor class alone: ATen/ATen.h (every op) tripled the compile

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace fastcollate {

// What a job writes (exported to Python as _C.JobKind).
enum class JobKind : int { Rows = 0, Mask = 1, Lengths = 2 };

// One output tensor of B rows.
struct Job {
  JobKind kind = JobKind::Rows;
  uint8_t* dst = nullptr;
  const int64_t* ptrs = nullptr;  // B source addresses (Rows)
  const int64_t* lens = nullptr;  // B lengths in positions; nullptr: every row has `L`
  int64_t rows = 0;               // B
  int64_t L = 0;                  // positions per output row (rows longer are truncated)
  int64_t inner = 1;              // elements per position
  at::ScalarType src = at::kByte, dst_t = at::kByte;
  uint8_t pad[16] = {0};          // one element of dst_t: the pad value, or the mask's 1
  bool left = false;
  bool transposed = false;        // Rows into an [L, B] block (inner == 1): default_collate of list rows
  size_t row_bytes = 0;           // output bytes per row
  // The memory a Rows job may read: `nspans` [start, end) address pairs, sorted and disjoint
  // (make_spans). Every row's read is checked against them before anything is written.
  const int64_t* spans = nullptr;
  int64_t nspans = 0;
};

// [start, end) pairs (flat) sorted by start, overlapping or touching ones merged: what
// Job::spans points at. Empty pairs are dropped.
std::vector<int64_t> make_spans(const int64_t* pairs, int64_t count);

// Whether a column of t can be read, and whether a column may be converted into t.
bool gather_supported(at::ScalarType t);
bool gather_convertible_to(at::ScalarType t);

// One element of t (a gather-supported dtype) holding an integer (is_int) or a float value, as
// torch would store it in a tensor of t (ints exactly, floats rounded once), written to out.
void encode_element(at::ScalarType t, bool is_int, int64_t iv, double dv, uint8_t* out);

// Batches gathered (either path), for fastcollate.stats(): counted here, an atomic, rather
// than under a Python lock once per batch.
extern std::atomic<uint64_t> g_gathered_batches;

// Checks every row of every job -- lengths >= 0, each Rows job's reads within its spans -- and
// raises (ValueError, naming the job and the row) before any byte is written: a damaged source
// (a corrupt Arrow offset) or a planning mistake can never make the copy read or write outside
// its memory. GIL-free.
void check_jobs(const std::vector<Job>& jobs);

// Checks the jobs (check_jobs), then runs every one (GIL released by the caller); total: their
// output bytes, which decides the threading.
void run_jobs(const std::vector<Job>& jobs, size_t total, int num_threads);

}  // namespace fastcollate
