// The row jobs of the gathers (see gather_rows.h): only moves and converts bytes, without the
// GIL, on the pool.
#include "engine/gather_rows.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "engine/copy.h"
#include "engine/pool.h"

namespace fastcollate {
namespace {

// Half and BFloat16 convert through float, as c10's conversions do (and as torch's .to() does).
template <typename S>
inline auto widened(S x) {
  if constexpr (std::is_same_v<S, c10::Half> || std::is_same_v<S, c10::BFloat16>) {
    return static_cast<float>(x);
  } else {
    return x;
  }
}

// n elements; dst element k at d[k * stride] (stride > 1: a transposed block)
template <typename S, typename D>
void convert(const S* s, D* d, int64_t n, int64_t stride) {
  if (stride == 1) {  // its own loop: the compiler vectorizes a unit-stride one only
    for (int64_t k = 0; k < n; ++k) d[k] = static_cast<D>(widened(s[k]));
    return;
  }
  for (int64_t k = 0; k < n; ++k) d[k * stride] = static_cast<D>(widened(s[k]));
}

// torch's dtypes that a column can hold, each with its C type
#define FC_GATHER_TYPES(_)           \
  _(at::kBool, bool)                 \
  _(at::kByte, uint8_t)              \
  _(at::kChar, int8_t)               \
  _(at::kShort, int16_t)             \
  _(at::kInt, int32_t)               \
  _(at::kLong, int64_t)              \
  _(at::kUInt16, uint16_t)           \
  _(at::kUInt32, uint32_t)           \
  _(at::kUInt64, uint64_t)           \
  _(at::kHalf, c10::Half)            \
  _(at::kBFloat16, c10::BFloat16)    \
  _(at::kFloat, float)               \
  _(at::kDouble, double)

}  // namespace

bool gather_supported(at::ScalarType t) {
#define FC_CASE(st, ct) \
  case st:              \
    return true;
  switch (t) {
    FC_GATHER_TYPES(FC_CASE)
    default:
      return false;
  }
#undef FC_CASE
}

// What a conversion may widen into (any column dtype may also stay as it is: a byte copy).
bool gather_convertible_to(at::ScalarType t) {
  return t == at::kLong || t == at::kInt || t == at::kFloat || t == at::kDouble || t == at::kHalf ||
         t == at::kBFloat16;
}

namespace {

template <typename S>
void convert_from(const S* s, void* d, at::ScalarType dst, int64_t n, int64_t stride) {
  switch (dst) {
    case at::kLong: return convert(s, static_cast<int64_t*>(d), n, stride);
    case at::kInt: return convert(s, static_cast<int32_t*>(d), n, stride);
    case at::kFloat: return convert(s, static_cast<float*>(d), n, stride);
    case at::kDouble: return convert(s, static_cast<double*>(d), n, stride);
    case at::kHalf: return convert(s, static_cast<c10::Half*>(d), n, stride);
    case at::kBFloat16: return convert(s, static_cast<c10::BFloat16*>(d), n, stride);
    default: TORCH_CHECK(false, "fastcollate gather: no conversion into ", dst);
  }
}

void convert_any(const void* s, at::ScalarType src, void* d, at::ScalarType dst, int64_t n, int64_t stride = 1) {
#define FC_CASE(st, ct) \
  case st:              \
    return convert_from<ct>(static_cast<const ct*>(s), d, dst, n, stride);
  switch (src) {
    FC_GATHER_TYPES(FC_CASE)
    default:
      TORCH_CHECK(false, "fastcollate gather: unsupported source dtype ", src);
  }
#undef FC_CASE
}

// `count` copies of one element.
inline void fill(uint8_t* dst, const uint8_t* elem, size_t item, int64_t count) {
  if (count > 0) fill_elements(dst, elem, item, static_cast<size_t>(count) * item);
}

void run_row(const Job& j, int64_t i) {
  const size_t item = c10::elementSize(j.dst_t);
  const int64_t len = j.lens ? j.lens[i] : j.L;
  const int64_t n = std::min(len, j.L);  // truncation keeps the first L positions
  if (j.kind == JobKind::Lengths) {
    reinterpret_cast<int64_t*>(j.dst)[i] = n;
    return;
  }
  const size_t pos_bytes = static_cast<size_t>(j.inner) * item;
  uint8_t* row = j.dst + static_cast<size_t>(i) * j.L * pos_bytes;
  const int64_t lead = j.left ? j.L - n : 0;  // padding before the values (left side)
  if (j.kind == JobKind::Mask) {
    const uint8_t zero[16] = {0};
    fill(row, zero, item, lead);
    fill(row + lead * item, j.pad, item, n);
    fill(row + (lead + n) * item, zero, item, j.L - lead - n);
    return;
  }
  const auto* src = reinterpret_cast<const uint8_t*>(static_cast<uintptr_t>(j.ptrs[i]));
  if (j.transposed) {  // element t of row i goes to [t, i]
    if (j.src == j.dst_t) {
      for (int64_t t = 0; t < n; ++t) std::memcpy(j.dst + (t * j.rows + i) * item, src + t * item, item);
    } else {
      convert_any(src, j.src, j.dst + i * item, j.dst_t, n, j.rows);
    }
    return;
  }
  fill(row, j.pad, item, lead * j.inner);
  if (j.src == j.dst_t) {
    std::memcpy(row + lead * pos_bytes, src, static_cast<size_t>(n) * pos_bytes);
  } else {
    convert_any(src, j.src, row + lead * pos_bytes, j.dst_t, n * j.inner);
  }
  fill(row + (lead + n) * pos_bytes, j.pad, item, (j.L - lead - n) * j.inner);
}

}  // namespace

void encode_element(at::ScalarType t, bool is_int, int64_t iv, double dv, uint8_t* out) {
#define FC_CASE(st, ct)                                                   \
  case st: {                                                              \
    ct v = is_int ? static_cast<ct>(iv) : static_cast<ct>(dv);            \
    std::memcpy(out, &v, sizeof(ct));                                     \
    return;                                                               \
  }
  switch (t) {
    FC_GATHER_TYPES(FC_CASE)
    default:
      TORCH_CHECK(false, "fastcollate gather: unsupported dtype ", t);
  }
#undef FC_CASE
}

std::atomic<uint64_t> g_gathered_batches{0};

std::vector<int64_t> make_spans(const int64_t* pairs, int64_t count) {
  std::vector<std::pair<int64_t, int64_t>> v;
  v.reserve(static_cast<size_t>(count));
  for (int64_t k = 0; k < count; ++k)
    if (pairs[2 * k + 1] > pairs[2 * k]) v.emplace_back(pairs[2 * k], pairs[2 * k + 1]);
  std::sort(v.begin(), v.end());
  std::vector<int64_t> out;
  for (const auto& [lo, hi] : v) {
    if (!out.empty() && lo <= out.back()) {
      out.back() = std::max(out.back(), hi);
    } else {
      out.push_back(lo);
      out.push_back(hi);
    }
  }
  return out;
}

namespace {

// Whether [p, p + bytes) lies inside one of the sorted, disjoint spans.
bool within(const int64_t* spans, int64_t nspans, uint64_t p, uint64_t bytes) {
  int64_t lo = 0, hi = nspans;  // the last span starting at or before p
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (static_cast<uint64_t>(spans[2 * mid]) <= p) lo = mid + 1; else hi = mid;
  }
  if (lo == 0) return false;
  const uint64_t end = static_cast<uint64_t>(spans[2 * (lo - 1) + 1]);
  return p < end && bytes <= end - p;
}

}  // namespace

void check_jobs(const std::vector<Job>& jobs) {
  for (size_t k = 0; k < jobs.size(); ++k) {
    const Job& j = jobs[k];
    const uint64_t src_item = c10::elementSize(j.src);
    for (int64_t i = 0; i < j.rows; ++i) {
      const int64_t len = j.lens ? j.lens[i] : j.L;
      TORCH_CHECK_VALUE(len >= 0, "fastcollate gather: job ", k, ", row ", i, ": length ", len,
                        " is negative (corrupt offsets?)");
      if (j.kind != JobKind::Rows) continue;
      // n <= L, and an output row of L positions fits the arena (checked where the job was
      // made), so the byte count cannot overflow
      const uint64_t bytes = static_cast<uint64_t>(std::min(len, j.L)) * static_cast<uint64_t>(j.inner) * src_item;
      if (bytes == 0) continue;
      const uint64_t p = static_cast<uint64_t>(j.ptrs[i]);
      TORCH_CHECK_VALUE(within(j.spans, j.nspans, p, bytes), "fastcollate gather: job ", k, ", row ", i, " would read ",
                        bytes, " bytes at address ", p, ", outside the memory of its source (corrupt offsets or "
                        "lengths?); nothing was written");
    }
  }
}

// Row-major: row i of every job before row i + 1, so a sample's columns are written while its
// source lines are still in cache (TokenWindows' input_ids and labels read the same window);
// threads take contiguous row ranges, every job's rows costing the same.
void run_jobs(const std::vector<Job>& jobs, size_t total, int num_threads) {
  check_jobs(jobs);
  int64_t rows = 0;
  for (const Job& j : jobs) rows = std::max(rows, j.rows);
  auto run_rows = [&jobs](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i)
      for (const Job& j : jobs)
        if (i < j.rows) run_row(j, i);
  };
  const int threads = total < kParallelCopyMinBytes ? 1 : std::max(1, num_threads);
  if (threads == 1 || rows < 2) {
    run_rows(0, rows);
    return;
  }
  // more tasks than threads, claimed as threads come free
  const int tasks = static_cast<int>(std::min<int64_t>(rows, threads * kTasksPerThread));
  parallel_run(tasks, [&](int t) { run_rows(rows * t / tasks, rows * (t + 1) / tasks); }, threads);
}

}  // namespace fastcollate
