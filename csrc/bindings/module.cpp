// fastcollate._C: the module, made of each file's register_* (bindings/register.h).
#include <torch/csrc/utils/pybind.h>
#include <torch/version.h>

#include "bindings/register.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace fc = fastcollate;
  m.doc() = "fastcollate's compiled engine";
  m.attr("with_cuda") = static_cast<bool>(FASTCOLLATE_WITH_CUDA);
  // The torch this module was compiled against, from torch's own headers: what fastcollate._ext
  // compares with the running torch when no build record (_C.build.json) sits beside the module.
  pybind11::dict build_info;
  build_info["torch"] = TORCH_VERSION;
#ifdef _GLIBCXX_USE_CXX11_ABI
  build_info["cxx11_abi"] = static_cast<bool>(_GLIBCXX_USE_CXX11_ABI);
#endif
  build_info["cuda_kernels"] = static_cast<bool>(FASTCOLLATE_WITH_CUDA);
  m.attr("build_info") = build_info;
  fc::register_collate(m);
  fc::register_engine_ops(m);
  fc::register_gather_ops(m);
  fc::register_fixed_gather(m);
  fc::register_ring_ops(m);
  fc::register_cache_ops(m);
  fc::register_image_ops(m);
  fc::register_exit_gate(m);
#if FASTCOLLATE_WITH_CUDA
  fc::register_host_ops(m);
#endif
}
