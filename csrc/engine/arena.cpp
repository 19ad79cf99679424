#include "engine/arena.h"

namespace fastcollate {

at::Tensor arena_view(const at::Tensor& arena, size_t offset, at::ScalarType dtype, c10::IntArrayRef sizes,
                      c10::IntArrayRef strides) {
  const size_t item = c10::elementSize(dtype);
  TORCH_CHECK(offset % item == 0, "fastcollate: arena offset ", offset, " is not a multiple of ", item);
  auto view = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(arena.storage()), arena.key_set(),
                                                       c10::scalarTypeToTypeMeta(dtype));
  if (strides.empty()) view.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
  else view.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides);
  view.unsafeGetTensorImpl()->set_storage_offset(static_cast<int64_t>((arena.storage_offset() + offset) / item));
  return view;
}

void run_copies(const ArenaWrites& writes, const at::Tensor& arena, int num_threads, bool stream_ok) {
  uint8_t* base = static_cast<uint8_t*>(arena.data_ptr());
  copy_pieces(writes.pieces, base, num_threads, stream_ok);
  transpose_pieces(writes.transposes, base, num_threads);
  fill_pieces(writes.fills, base);
  for (const Conversion& c : writes.conversions) {
    arena_view(arena, c.dst_offset, c.dtype, c.sizes, c.strides).copy_(c.src);
  }
}

}  // namespace fastcollate
