// The engine's own entry points (GIL held around them, released for the copy): the arena pool,
// the raw threaded copy, the pool's thread count, the arena alignment.
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <vector>

#include "bindings/register.h"
#include "python/nogil.h"
#include "engine/arena.h"
#include "engine/arena_pool.h"
#include "engine/copy.h"
#include "engine/pool.h"

namespace fastcollate {
namespace {

// Raw threaded copy of src into dst (same byte size): the benchmark's engine ceiling and a
// direct test of the byte split.
void copy_bytes(const at::Tensor& dst, const at::Tensor& src, int num_threads, int64_t piece_bytes) {
  TORCH_CHECK(dst.is_contiguous() && src.is_contiguous() && dst.device().is_cpu() && src.device().is_cpu(),
              "copy_bytes: contiguous CPU tensors only");
  const size_t n = src.numel() * src.element_size();
  TORCH_CHECK(static_cast<size_t>(dst.numel() * dst.element_size()) == n, "copy_bytes: sizes differ");
  TORCH_CHECK(piece_bytes > 0, "copy_bytes: piece_bytes must be positive");
  std::vector<CopyPiece> pieces;
  const auto* s = static_cast<const uint8_t*>(src.data_ptr());
  for (size_t off = 0; off < n; off += static_cast<size_t>(piece_bytes)) {
    pieces.push_back({s + off, off, std::min(n - off, static_cast<size_t>(piece_bytes))});
  }
  NoGil no_gil;
  copy_pieces(pieces, static_cast<uint8_t*>(dst.data_ptr()), num_threads);
}

}  // namespace

void register_engine_ops(pybind11::module_& m) {
  m.def("pool_allocate", [](size_t n) { return pool_allocate(n); });
  m.def("pool_size_class", &pool_size_class);
  m.def("pool_set_limit", &pool_set_limit);
  m.def("pool_trim", &pool_trim);
  m.def("copy_bytes", &copy_bytes, py::arg("dst"), py::arg("src"), py::arg("num_threads"), py::arg("piece_bytes"));
  m.def("hardware_threads", &hardware_threads);
  m.attr("align") = kLeafAlign;
}

}  // namespace fastcollate
