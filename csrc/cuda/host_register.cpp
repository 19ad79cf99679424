// Page-locking memory that torch's caching host allocator did not hand out (the worker ring),
// built only with CUDA. cudaHostRegister's failure (containers, `ulimit -l`, gVisor) also sets
// the calling thread's last error, which the next launch check in that thread -- any kernel --
// would raise as its own; it is read here and cleared, and returned as text.
#include <cuda_runtime_api.h>
#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <string>

#include "bindings/register.h"
#include "python/nogil.h"

namespace fastcollate {
namespace {

std::string take_error(cudaError_t err) {
  if (err == cudaSuccess) return {};
  (void)cudaGetLastError();  // clear it: the failure is reported here, not by the next kernel
  return std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
}

// "" when the range is page-locked, else why not.
std::string host_register(uintptr_t ptr, size_t nbytes) {
  cudaError_t err;
  {
    NoGil no_gil;  // pinning a large range takes milliseconds
    err = cudaHostRegister(reinterpret_cast<void*>(ptr), nbytes, cudaHostRegisterPortable);
  }
  return take_error(err);
}

std::string host_unregister(uintptr_t ptr) {
  cudaError_t err;
  {
    NoGil no_gil;
    err = cudaHostUnregister(reinterpret_cast<void*>(ptr));
  }
  return take_error(err);
}

}  // namespace

void register_host_ops(pybind11::module_& m) {
  m.def("host_register", &host_register, pybind11::arg("ptr"), pybind11::arg("nbytes"));
  m.def("host_unregister", &host_unregister, pybind11::arg("ptr"));
}

}  // namespace fastcollate
