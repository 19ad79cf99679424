// The gather of fastcollate.arrays: rows of columns that already sit in memory (numpy arrays,
// memmaps, tensors, Arrow buffers) written straight into a batch's arena -- no Python object per
// sample. The Python layer plans (row addresses, lengths, output shapes, arena offsets, bounds
// checked there); this file only moves and converts bytes, without the GIL, on the copy pool.
#include <torch/csrc/utils/pybind.h>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "copy_engine.h"
#include "gather.h"
#include "plan.h"

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
void fill(uint8_t* dst, const uint8_t* elem, size_t item, int64_t count) {
  if (count <= 0) return;
  bool uniform = true;
  for (size_t i = 1; i < item; ++i) uniform = uniform && elem[i] == elem[0];
  if (uniform) {
    std::memset(dst, elem[0], count * item);
    return;
  }
  for (int64_t k = 0; k < count; ++k) std::memcpy(dst + k * item, elem, item);
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

void pad_element(py::handle value, at::ScalarType t, uint8_t* out) {
  // the value as torch would store it in a tensor of t (ints exactly, floats rounded once)
  const bool is_int = PyLong_Check(value.ptr()) != 0;
  const int64_t iv = is_int ? value.cast<int64_t>() : 0;
  const double dv = is_int ? static_cast<double>(iv) : value.cast<double>();
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

// The tensor stays alive for the whole call: the job tuples, in the list the caller passed, hold it.
const int64_t* int64_data(py::handle obj, int64_t rows, const char* what) {
  if (obj.is_none()) return nullptr;
  const at::Tensor t = obj.cast<at::Tensor>();
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kLong && t.dim() == 1 && t.is_contiguous() &&
                  t.numel() == rows,
              "fastcollate gather: ", what, " must be a contiguous int64 CPU tensor of ", rows, " elements");
  return t.data_ptr<int64_t>();
}

}  // namespace

std::atomic<uint64_t> g_gathered_batches{0};

// Row-major: row i of every job before row i + 1, so a sample's columns are written while its
// source lines are still in cache (TokenWindows' input_ids and labels read the same window);
// threads take contiguous row ranges, every job's rows costing the same.
void run_jobs(const std::vector<Job>& jobs, size_t total, int num_threads) {
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

namespace {

// jobs: (kind, dst_offset, ptrs, lens, rows, L, inner, src_dtype, dst_dtype, pad, left, transposed,
// shape); returns each job's output as a view of the arena of that shape (None where shape is).
py::list gather(const at::Tensor& arena, const py::list& specs, int num_threads) {
  TORCH_CHECK(arena.device().is_cpu() && arena.scalar_type() == at::kByte && arena.dim() == 1 && arena.is_contiguous(),
              "fastcollate gather: the arena must be a contiguous 1-D uint8 CPU tensor");
  const size_t capacity = static_cast<size_t>(arena.numel());
  auto* base = static_cast<uint8_t*>(arena.data_ptr());
  std::vector<Job> jobs;
  py::list views;
  size_t total = 0;
  for (py::handle h : specs) {
    const py::tuple s = h.cast<py::tuple>();
    TORCH_CHECK(s.size() == 13, "fastcollate gather: a job is a 13-tuple");
    Job j;
    j.kind = static_cast<JobKind>(s[0].cast<int>());
    const size_t offset = s[1].cast<size_t>();
    j.rows = s[4].cast<int64_t>();
    j.ptrs = int64_data(s[2], j.rows, "ptrs");
    j.lens = int64_data(s[3], j.rows, "lens");
    j.L = s[5].cast<int64_t>();
    j.inner = s[6].cast<int64_t>();
    j.src = s[7].cast<at::ScalarType>();
    j.dst_t = s[8].cast<at::ScalarType>();
    j.left = s[10].cast<bool>();
    j.transposed = s[11].cast<bool>();
    if (j.kind != JobKind::Rows) j.inner = 1;
    TORCH_CHECK(j.rows >= 0 && j.L >= 0 && j.inner >= 0, "fastcollate gather: bad job geometry");
    TORCH_CHECK(gather_supported(j.src) && gather_supported(j.dst_t), "fastcollate gather: unsupported dtype ", j.src, " -> ", j.dst_t);
    TORCH_CHECK(j.src == j.dst_t || gather_convertible_to(j.dst_t) || j.kind != JobKind::Rows,
                "fastcollate gather: no conversion from ", j.src, " into ", j.dst_t);
    TORCH_CHECK(j.kind != JobKind::Rows || j.ptrs != nullptr, "fastcollate gather: a rows job needs ptrs");
    TORCH_CHECK(!j.transposed || j.inner == 1, "fastcollate gather: a transposed job has one element per position");
    TORCH_CHECK(j.kind != JobKind::Lengths || j.dst_t == at::kLong, "fastcollate gather: lengths are int64");
    const size_t item = c10::elementSize(j.dst_t);
    j.row_bytes = j.kind == JobKind::Lengths ? item : static_cast<size_t>(j.L) * j.inner * item;
    TORCH_CHECK(offset % item == 0 && offset + j.row_bytes * j.rows <= capacity,
                "fastcollate gather: a job's output does not fit the arena");
    if (j.kind == JobKind::Mask) {
      pad_element(py::int_(1), j.dst_t, j.pad);
    } else if (j.kind == JobKind::Rows) {
      pad_element(s[9], j.dst_t, j.pad);
    }
    j.dst = base + offset;
    total += j.row_bytes * j.rows;
    if (s[12].is_none()) {
      views.append(py::none());
    } else {
      const auto shape = s[12].cast<std::vector<int64_t>>();
      int64_t numel = 1;
      for (int64_t d : shape) numel *= d;
      TORCH_CHECK(static_cast<size_t>(numel) * item == j.row_bytes * j.rows, "fastcollate gather: a view's shape ",
                  shape, " does not cover its job's output");
      views.append(arena_view(arena, offset, j.dst_t, shape));
    }
    jobs.push_back(j);
  }
  {
    py::gil_scoped_release no_gil;
    run_jobs(jobs, total, num_threads);
  }
  g_gathered_batches.fetch_add(1, std::memory_order_relaxed);
  return views;
}

}  // namespace

void register_gather_ops(pybind11::module_& m) {
  m.def("gather", &gather, py::arg("arena"), py::arg("jobs"), py::arg("num_threads"));
}

}  // namespace fastcollate
