// The planned gather of fastcollate.data (GIL held): the jobs the Python layer planned (row
// addresses, lengths, output shapes, arena offsets, bounds checked there) read and checked here,
// their outputs' views made, and the jobs run by the engine (engine/gather_rows.h) with the GIL
// released.
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <vector>

#include "bindings/register.h"
#include "python/nogil.h"
#include "engine/gather_rows.h"
#include "python/plan.h"

namespace fastcollate {
namespace {

void pad_element(py::handle value, at::ScalarType t, uint8_t* out) {
  const bool is_int = PyLong_Check(value.ptr()) != 0;
  const int64_t iv = is_int ? value.cast<int64_t>() : 0;
  encode_element(t, is_int, iv, is_int ? static_cast<double>(iv) : value.cast<double>(), out);
}

// One job of a planned gather as gather.py builds it: _C.GatherJob(kind=..., offset=..., ...).
struct GatherJob {
  JobKind kind = JobKind::Rows;
  int64_t offset = 0;                         // of the job's output in the arena, bytes
  std::optional<at::Tensor> ptrs;             // B row addresses, int64 (Rows)
  std::optional<at::Tensor> lens;             // B row lengths, int64; None: every row has L
  int64_t rows = 0;                           // B
  int64_t L = 0;                              // positions per output row
  int64_t inner = 1;                          // elements per position
  at::ScalarType src = at::kByte;             // the column's dtype
  at::ScalarType dst = at::kByte;             // the output's dtype
  py::object pad;                             // the pad value (Rows)
  bool left = false;                          // padding before the values
  bool transposed = false;                    // an [L, B] block: default_collate of list rows
  std::optional<std::vector<int64_t>> shape;  // the output view's shape; None: no view
  std::optional<at::Tensor> spans;            // [k, 2] int64: the [start, end) addresses Rows may read
};

// The tensor stays alive for the whole call: the jobs, in the list the caller passed, hold it.
const int64_t* int64_data(const std::optional<at::Tensor>& t, int64_t rows, const char* what) {
  if (!t.has_value()) return nullptr;
  TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kLong && t->dim() == 1 && t->is_contiguous() &&
                  t->numel() == rows,
              "fastcollate gather: ", what, " must be a contiguous int64 CPU tensor of ", rows, " elements");
  return t->data_ptr<int64_t>();
}

// Runs the jobs (GatherJob) into the arena; returns each job's output as a view of the arena of
// its shape (None where shape is).
py::list gather(const at::Tensor& arena, const py::list& specs, int num_threads) {
  TORCH_CHECK(arena.device().is_cpu() && arena.scalar_type() == at::kByte && arena.dim() == 1 && arena.is_contiguous(),
              "fastcollate gather: the arena must be a contiguous 1-D uint8 CPU tensor");
  const size_t capacity = static_cast<size_t>(arena.numel());
  auto* base = static_cast<uint8_t*>(arena.data_ptr());
  std::vector<Job> jobs;
  std::vector<std::vector<int64_t>> spans;  // each job's, sorted and merged (Job::spans points here)
  spans.reserve(specs.size());
  py::list views;
  size_t total = 0;
  for (py::handle h : specs) {
    const GatherJob& s = h.cast<const GatherJob&>();
    Job j;
    j.kind = s.kind;
    TORCH_CHECK(s.offset >= 0, "fastcollate gather: a job's offset is negative");
    const size_t offset = static_cast<size_t>(s.offset);
    j.rows = s.rows;
    j.ptrs = int64_data(s.ptrs, j.rows, "ptrs");
    j.lens = int64_data(s.lens, j.rows, "lens");
    j.L = s.L;
    j.inner = s.inner;
    j.src = s.src;
    j.dst_t = s.dst;
    j.left = s.left;
    j.transposed = s.transposed;
    if (j.kind != JobKind::Rows) j.inner = 1;
    TORCH_CHECK(j.rows >= 0 && j.L >= 0 && j.inner >= 0, "fastcollate gather: bad job geometry");
    TORCH_CHECK(gather_supported(j.src) && gather_supported(j.dst_t), "fastcollate gather: unsupported dtype ", j.src, " -> ", j.dst_t);
    TORCH_CHECK(j.src == j.dst_t || gather_convertible_to(j.dst_t) || j.kind != JobKind::Rows,
                "fastcollate gather: no conversion from ", j.src, " into ", j.dst_t);
    TORCH_CHECK(j.kind != JobKind::Rows || j.ptrs != nullptr, "fastcollate gather: a rows job needs ptrs");
    if (j.kind == JobKind::Rows) {  // what its rows may read: checked row by row before anything is written
      TORCH_CHECK(s.spans.has_value() && s.spans->device().is_cpu() && s.spans->scalar_type() == at::kLong &&
                      s.spans->dim() == 2 && s.spans->size(1) == 2 && s.spans->is_contiguous(),
                  "fastcollate gather: a rows job needs spans, a contiguous [k, 2] int64 CPU tensor of the "
                  "[start, end) addresses it may read");
      spans.push_back(make_spans(s.spans->data_ptr<int64_t>(), s.spans->size(0)));
      j.spans = spans.back().data();
      j.nspans = static_cast<int64_t>(spans.back().size() / 2);
    }
    TORCH_CHECK(!j.transposed || j.inner == 1, "fastcollate gather: a transposed job has one element per position");
    TORCH_CHECK(j.kind != JobKind::Lengths || j.dst_t == at::kLong, "fastcollate gather: lengths are int64");
    const size_t item = c10::elementSize(j.dst_t);
    j.row_bytes = j.kind == JobKind::Lengths ? item : static_cast<size_t>(j.L) * j.inner * item;
    TORCH_CHECK(offset % item == 0 && offset + j.row_bytes * j.rows <= capacity,
                "fastcollate gather: a job's output does not fit the arena");
    if (j.kind == JobKind::Mask) {
      pad_element(py::int_(1), j.dst_t, j.pad);
    } else if (j.kind == JobKind::Rows) {
      pad_element(s.pad, j.dst_t, j.pad);
    }
    j.dst = base + offset;
    total += j.row_bytes * j.rows;
    if (!s.shape.has_value()) {
      views.append(py::none());
    } else {
      const std::vector<int64_t>& shape = *s.shape;
      int64_t numel = 1;
      for (int64_t d : shape) numel *= d;
      TORCH_CHECK(static_cast<size_t>(numel) * item == j.row_bytes * j.rows, "fastcollate gather: a view's shape ",
                  shape, " does not cover its job's output");
      views.append(arena_view(arena, offset, j.dst_t, shape));
    }
    jobs.push_back(j);
  }
  {
    NoGil no_gil;
    run_jobs(jobs, total, num_threads);
  }
  g_gathered_batches.fetch_add(1, std::memory_order_relaxed);
  return views;
}

}  // namespace

void register_gather_ops(pybind11::module_& m) {
  py::enum_<JobKind>(m, "JobKind", "What a gather job writes: rows of a column, a padding mask, or lengths.")
      .value("Rows", JobKind::Rows)
      .value("Mask", JobKind::Mask)
      .value("Lengths", JobKind::Lengths);
  py::class_<GatherJob>(m, "GatherJob", "One output tensor of a planned gather (see fastcollate/data/gather.py).")
      .def(py::init([](JobKind kind, int64_t offset, std::optional<at::Tensor> ptrs, std::optional<at::Tensor> lens,
                       int64_t rows, int64_t L, int64_t inner, at::ScalarType src, at::ScalarType dst, py::object pad,
                       bool left, bool transposed, std::optional<std::vector<int64_t>> shape,
                       std::optional<at::Tensor> spans) {
             return GatherJob{kind, offset, std::move(ptrs), std::move(lens), rows, L, inner, src, dst,
                              std::move(pad), left, transposed, std::move(shape), std::move(spans)};
           }),
           py::kw_only(), py::arg("kind"), py::arg("offset"), py::arg("ptrs") = py::none(), py::arg("lens") = py::none(),
           py::arg("rows"), py::arg("L"), py::arg("inner") = 1, py::arg("src"), py::arg("dst"),
           py::arg("pad") = py::int_(0), py::arg("left") = false, py::arg("transposed") = false,
           py::arg("shape") = py::none(), py::arg("spans") = py::none())
      .def_readonly("kind", &GatherJob::kind)
      .def_readonly("offset", &GatherJob::offset)
      .def_readonly("ptrs", &GatherJob::ptrs)
      .def_readonly("lens", &GatherJob::lens)
      .def_readonly("rows", &GatherJob::rows)
      .def_readonly("L", &GatherJob::L)
      .def_readonly("inner", &GatherJob::inner)
      .def_readonly("src", &GatherJob::src)
      .def_readonly("dst", &GatherJob::dst)
      .def_readonly("pad", &GatherJob::pad)
      .def_readonly("left", &GatherJob::left)
      .def_readonly("transposed", &GatherJob::transposed)
      .def_readonly("shape", &GatherJob::shape)
      .def_readonly("spans", &GatherJob::spans);
  m.def("gather", &gather, py::arg("arena"), py::arg("jobs"), py::arg("num_threads"));
}

}  // namespace fastcollate
