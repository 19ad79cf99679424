// fastcollate._C: the module, made of each file's register_* (bindings/register.h).
#include <torch/csrc/utils/pybind.h>

#include "bindings/register.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace fc = fastcollate;
  m.doc() = "fastcollate's compiled engine";
  m.attr("with_cuda") = static_cast<bool>(FASTCOLLATE_WITH_CUDA);
  fc::register_collate(m);
  fc::register_engine_ops(m);
  fc::register_gather_ops(m);
  fc::register_fixed_gather(m);
  fc::register_ring_ops(m);
#if FASTCOLLATE_WITH_CUDA
  fc::register_host_ops(m);
#endif
}
