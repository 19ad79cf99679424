// The planned gather of fastcollate.data (GIL held): the jobs the Python layer planned (row
// addresses, lengths, output shapes, arena offsets, bounds checked there) read and checked here,
// their outputs' views made, and the jobs run by the engine (engine/gather_rows.h) with the GIL
// released.
#include <torch/csrc/utils/pybind.h>

#include <vector>

#include "bindings/register.h"
#include "engine/gather_rows.h"
#include "python/plan.h"

namespace fastcollate {
namespace {

void pad_element(py::handle value, at::ScalarType t, uint8_t* out) {
  const bool is_int = PyLong_Check(value.ptr()) != 0;
  const int64_t iv = is_int ? value.cast<int64_t>() : 0;
  encode_element(t, is_int, iv, is_int ? static_cast<double>(iv) : value.cast<double>(), out);
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
