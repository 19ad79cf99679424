// The torch-facing side of the normalize kernel (built only with CUDA): checks, device guard,
// current stream, output allocation, launch check.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/utils/pybind.h>

#include <vector>

#include "bindings/register.h"
#include "cuda/normalize.cuh"

namespace fastcollate {

at::Tensor normalize_u8_cuda(const at::Tensor& x, const std::vector<double>& mean, const std::vector<double>& std,
                             double scale, at::ScalarType dtype, bool channels_last) {
  TORCH_CHECK(x.is_cuda(), "normalize_u8_cuda: expected a CUDA tensor, got one on ", x.device());
  TORCH_CHECK(x.scalar_type() == at::kByte, "normalize_u8_cuda: expected uint8 input, got ", x.scalar_type());
  TORCH_CHECK(x.dim() == 4, "normalize_u8_cuda: expected [N, C, H, W], got shape ", x.sizes());
  const int64_t c = x.size(1);
  TORCH_CHECK(c >= 1 && c <= kMaxNormalizeChannels, "normalize_u8_cuda: 1 to ", kMaxNormalizeChannels,
              " channels supported, got ", c);
  TORCH_CHECK(static_cast<int64_t>(mean.size()) == c && static_cast<int64_t>(std.size()) == c,
              "normalize_u8_cuda: mean and std need one value per channel (", c, "), got ", mean.size(), " and ",
              std.size());
  OutKind kind;
  switch (dtype) {
    case at::kFloat: kind = OutKind::Float32; break;
    case at::kHalf: kind = OutKind::Float16; break;
    case at::kBFloat16: kind = OutKind::BFloat16; break;
    default: TORCH_CHECK(false, "normalize_u8_cuda: output dtype must be float32, float16 or bfloat16, got ", dtype);
  }
  c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor in = x.contiguous();
  at::Tensor out = at::empty(x.sizes(), x.options().dtype(dtype),
                             channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous);
  NormalizeParams p{};
  p.scale = static_cast<float>(scale);
  for (int64_t i = 0; i < c; ++i) {
    p.mean[i] = static_cast<float>(mean[i]);
    p.std[i] = static_cast<float>(std[i]);
  }
  C10_CUDA_CHECK(launch_normalize_u8(in.data_ptr<uint8_t>(), out.data_ptr(), kind, x.size(0), c, x.size(2) * x.size(3),
                                     channels_last, p, c10::cuda::getCurrentCUDAStream().stream()));
  return out;
}

void register_cuda_ops(pybind11::module_& m) {
  m.def("normalize_u8_cuda", &normalize_u8_cuda, pybind11::arg("x"), pybind11::arg("mean"), pybind11::arg("std"),
        pybind11::arg("scale"), pybind11::arg("dtype"), pybind11::arg("channels_last"));
}

}  // namespace fastcollate
