// The CUDA kernel of the fastcollate::normalize op (CUDA builds only; the schema and the CPU
// kernel: engine/normalize.cpp): checks, device guard, current stream, output allocation as the
// op's other kernels and its fake allocate it, launch check.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "cuda/normalize.cuh"
#include "engine/normalize.h"

namespace fastcollate {
namespace {

at::Tensor normalize_cuda(const at::Tensor& x, const at::Tensor& mean, const at::Tensor& std, const at::Tensor& scale,
                          at::ScalarType dtype, bool channels_last) {
  TORCH_CHECK(x.is_cuda(), "fastcollate::normalize (CUDA): expected a CUDA tensor, got one on ", x.device());
  check_normalize_args(x, mean, std, scale, dtype, channels_last);
  // the kernel reads NCHW-contiguous bytes; any other layout takes the same fp32 operations in ATen
  if (!x.is_contiguous()) return normalize_aten(x, mean, std, scale, dtype, channels_last);
  OutKind kind = OutKind::Float32;
  if (dtype == at::kHalf) kind = OutKind::Float16;
  if (dtype == at::kBFloat16) kind = OutKind::BFloat16;
  c10::cuda::CUDAGuard guard(x.device());
  // the output's strides are those of x.to(dtype) (preserved format) or of channels_last
  at::Tensor out = channels_last
                       ? at::empty(x.sizes(), x.options().dtype(dtype), at::MemoryFormat::ChannelsLast)
                       : at::empty_like(x, x.options().dtype(dtype));
  const int64_t n = x.dim() == 4 ? x.size(0) : 1;
  C10_CUDA_CHECK(launch_normalize_u8(x.data_ptr<uint8_t>(), out.data_ptr(), kind, n, x.size(-3),
                                     x.size(-2) * x.size(-1), channels_last, mean.data_ptr<float>(),
                                     std.data_ptr<float>(), scale.data_ptr<float>(),
                                     c10::cuda::getCurrentCUDAStream().stream()));
  return out;
}

}  // namespace
}  // namespace fastcollate

TORCH_LIBRARY_IMPL(fastcollate, CUDA, m) { m.impl("normalize", &fastcollate::normalize_cuda); }
