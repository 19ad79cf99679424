// The compiled gather of datasets whose columns all have rows of one length at affine addresses
// (TokenWindows; ArrayDataset over arrays, memmaps, tensors): its template is built once per
// dataset, so a batch costs the parse of its index list and the copies -- no plan in Python,
// no job tuples. Anything unusual (an index that is not a plain int or is out of range, an
// empty batch) answers None, and gather.py takes the planned path, which reports the error.
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "bindings/register.h"
#include "python/nogil.h"
#include "engine/arena_pool.h"
#include "engine/gather_rows.h"
#include "python/plan.h"

namespace fastcollate {
namespace {

// One column of the template as gather.py builds it: _C.FixedColumn(base=..., row_stride=..., ...).
struct Column {
  int64_t base = 0, row_stride = 0, shift = 0;  // row r starts at base + r * row_stride + shift
  int64_t L = 1, inner = 1;                     // positions per row, elements per position (0: empty rows)
  at::ScalarType src = at::kByte, dst = at::kByte;
  std::vector<int64_t> trailing;                // the row's dimensions after L
  bool scalar = false;                          // a batch is [B]
  int64_t lo = 0, hi = 0;                       // the [start, end) addresses of the memory rows live in
  size_t row_bytes = 0;                         // output bytes per row (computed by FixedGather)
  std::vector<int64_t> spans;                   // {lo, hi}: what Job::spans points at
};

size_t aligned(size_t n) { return (n + kLeafAlign - 1) / kLeafAlign * kLeafAlign; }

class FixedGather {
 public:
  // columns: one FixedColumn per key; keep holds the arrays the addresses point into.
  FixedGather(const py::list& keys, bool mapping, int64_t n, const py::list& columns, py::object keep)
      : mapping_(mapping), n_(n), keep_(std::move(keep)) {
    TORCH_CHECK(keys.size() == columns.size() && n >= 0, "fastcollate FixedGather: one column per key");
    for (py::handle k : keys) keys_.push_back(py::reinterpret_borrow<py::object>(k));
    for (py::handle h : columns) {
      Column c = h.cast<Column>();
      TORCH_CHECK(c.L >= 0 && c.inner >= 0 && (!c.scalar || (c.L == 1 && c.inner == 1)),
                  "fastcollate FixedGather: bad column geometry");
      TORCH_CHECK(gather_supported(c.src) && gather_supported(c.dst) &&
                      (c.src == c.dst || gather_convertible_to(c.dst)),
                  "fastcollate FixedGather: no gather from ", c.src, " into ", c.dst);
      c.row_bytes = static_cast<size_t>(c.L * c.inner) * c10::elementSize(c.dst);
      c.spans = make_spans(std::vector<int64_t>{c.lo, c.hi}.data(), 1);
      columns_.push_back(std::move(c));
    }
  }

  // The arena bytes of a batch of B rows (each column 64-byte aligned, as gather.py lays out).
  size_t nbytes(int64_t B) const {
    size_t total = 0;
    for (const Column& c : columns_) total += aligned(c.row_bytes * B);
    return std::max(total, kLeafAlign);
  }

  // The collated batch of dataset rows `indices`, in an arena from alloc (None: the pool), or
  // None when the planned path must decide.
  py::object operator()(py::handle indices, py::handle alloc, int num_threads) const {
    PyObject* seq = indices.ptr();
    if (!PyList_CheckExact(seq) && !PyTuple_CheckExact(seq)) return py::none();
    const int64_t B = PySequence_Fast_GET_SIZE(seq);
    if (B == 0) return py::none();
    PyObject** items = PySequence_Fast_ITEMS(seq);
    std::vector<int64_t> rows(B);
    for (int64_t i = 0; i < B; ++i) {
      // exact ints only: bools, numpy integers and the rest take the planned path and its rules
      if (!PyLong_CheckExact(items[i])) return py::none();
      int overflow = 0;
      const long long v = PyLong_AsLongLongAndOverflow(items[i], &overflow);
      if (overflow != 0 || v < -n_ || v >= n_) return py::none();
      rows[i] = v < 0 ? v + n_ : v;
    }
    const size_t size = nbytes(B);
    at::Tensor arena = alloc.is_none() ? pool_allocate(size) : checked_arena(alloc, size);
    auto* base = static_cast<uint8_t*>(arena.data_ptr());
    std::vector<int64_t> ptrs(static_cast<size_t>(B) * columns_.size());
    std::vector<Job> jobs(columns_.size());
    std::vector<size_t> offsets(columns_.size());
    size_t at = 0, total = 0;
    for (size_t k = 0; k < columns_.size(); ++k) {
      const Column& c = columns_[k];
      int64_t* p = ptrs.data() + k * B;
      for (int64_t i = 0; i < B; ++i) p[i] = c.base + rows[i] * c.row_stride + c.shift;
      Job& j = jobs[k];
      j.dst = base + at;
      j.ptrs = p;
      j.rows = B;
      j.L = c.L;
      j.inner = c.inner;
      j.src = c.src;
      j.dst_t = c.dst;
      j.row_bytes = c.row_bytes;
      j.spans = c.spans.data();
      j.nspans = static_cast<int64_t>(c.spans.size() / 2);
      offsets[k] = at;
      at += aligned(c.row_bytes * B);
      total += c.row_bytes * B;
    }
    {
      NoGil no_gil;
      run_jobs(jobs, total, num_threads);
    }
    g_gathered_batches.fetch_add(1, std::memory_order_relaxed);
    auto view = [&](size_t k) {
      const Column& c = columns_[k];
      std::vector<int64_t> shape{B};
      if (!c.scalar) {
        shape.push_back(c.L);
        shape.insert(shape.end(), c.trailing.begin(), c.trailing.end());
      }
      return py::cast(arena_view(arena, offsets[k], c.dst, shape));
    };
    // default_collate: a dict in the samples' key order, a list for tuple samples
    if (mapping_) {
      py::dict out;
      for (size_t k = 0; k < columns_.size(); ++k) out[keys_[k]] = view(k);
      return std::move(out);
    }
    py::list out(columns_.size());
    for (size_t k = 0; k < columns_.size(); ++k) out[k] = view(k);
    return std::move(out);
  }

 private:
  std::vector<py::object> keys_;
  std::vector<Column> columns_;
  bool mapping_;
  int64_t n_;
  py::object keep_;
};

}  // namespace

void register_fixed_gather(pybind11::module_& m) {
  py::class_<Column>(m, "FixedColumn", "One column of a FixedGather: where its rows are and what they become.")
      .def(py::init([](int64_t base, int64_t row_stride, int64_t shift, int64_t L, int64_t inner, at::ScalarType src,
                       at::ScalarType dst, std::vector<int64_t> trailing, bool scalar, int64_t lo, int64_t hi) {
             return Column{base, row_stride, shift, L, inner, src, dst, std::move(trailing), scalar, lo, hi};
           }),
           py::kw_only(), py::arg("base"), py::arg("row_stride"), py::arg("shift"), py::arg("L"), py::arg("inner"),
           py::arg("src"), py::arg("dst"), py::arg("trailing"), py::arg("scalar"), py::arg("lo"), py::arg("hi"))
      .def_readonly("base", &Column::base)
      .def_readonly("row_stride", &Column::row_stride)
      .def_readonly("shift", &Column::shift)
      .def_readonly("L", &Column::L)
      .def_readonly("inner", &Column::inner)
      .def_readonly("src", &Column::src)
      .def_readonly("dst", &Column::dst)
      .def_readonly("trailing", &Column::trailing)
      .def_readonly("scalar", &Column::scalar)
      .def_readonly("lo", &Column::lo)
      .def_readonly("hi", &Column::hi);
  py::class_<FixedGather>(m, "FixedGather")
      .def(py::init<const py::list&, bool, int64_t, const py::list&, py::object>(), py::arg("keys"),
           py::arg("mapping"), py::arg("rows"), py::arg("columns"), py::arg("keep"))
      .def("nbytes", &FixedGather::nbytes, py::arg("batch_size"))
      .def("__call__", &FixedGather::operator(), py::arg("indices"), py::arg("alloc"), py::arg("num_threads"));
}

}  // namespace fastcollate
