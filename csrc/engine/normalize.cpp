// The fastcollate::normalize op: its schema and its CPU kernel (see engine/normalize.h).
#include "engine/normalize.h"

#include <torch/library.h>

namespace fastcollate {

void check_normalize_args(const at::Tensor& x, const at::Tensor& mean, const at::Tensor& std, const at::Tensor& scale,
                          at::ScalarType dtype, bool channels_last) {
  TORCH_CHECK(x.scalar_type() == at::kByte, "fastcollate::normalize: expected uint8 input, got ", x.scalar_type());
  TORCH_CHECK(x.dim() == 4 || x.dim() == 3, "fastcollate::normalize: expected [N, C, H, W] or [C, H, W], got shape ",
              x.sizes());
  TORCH_CHECK(!channels_last || x.dim() == 4, "fastcollate::normalize: channels_last needs 4-D input, got shape ",
              x.sizes());
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16,
              "fastcollate::normalize: output dtype must be float32, float16 or bfloat16, got ", dtype);
  const int64_t c = x.size(-3);
  auto per_channel = [&](const char* name, const at::Tensor& t) {
    TORCH_CHECK(t.scalar_type() == at::kFloat && t.dim() == 1 && t.size(0) == c && t.is_contiguous() &&
                    t.device() == x.device(),
                "fastcollate::normalize: ", name, " must be a contiguous float32 tensor of ", c,
                " values (one per channel) on ", x.device(), ", got ", t.scalar_type(), " of shape ", t.sizes(),
                " on ", t.device());
  };
  per_channel("mean", mean);
  per_channel("std", std);
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.numel() == 1 && scale.device() == x.device(),
              "fastcollate::normalize: scale must be a one-element float32 tensor on ", x.device(), ", got ",
              scale.scalar_type(), " of shape ", scale.sizes(), " on ", scale.device());
}

at::Tensor normalize_aten(const at::Tensor& x, const at::Tensor& mean, const at::Tensor& std, const at::Tensor& scale,
                          at::ScalarType dtype, bool channels_last) {
  // divide, subtract, divide: each an IEEE fp32 operation, as the CUDA kernel does them
  at::Tensor y = x.to(at::kFloat);
  y.div_(scale).sub_(mean.view({-1, 1, 1})).div_(std.view({-1, 1, 1}));
  if (channels_last) return y.to(dtype, /*non_blocking=*/false, /*copy=*/false, at::MemoryFormat::ChannelsLast);
  return y.to(dtype);
}

namespace {

at::Tensor normalize_cpu(const at::Tensor& x, const at::Tensor& mean, const at::Tensor& std, const at::Tensor& scale,
                         at::ScalarType dtype, bool channels_last) {
  check_normalize_args(x, mean, std, scale, dtype, channels_last);
  return normalize_aten(x, mean, std, scale, dtype, channels_last);
}

}  // namespace
}  // namespace fastcollate

TORCH_LIBRARY(fastcollate, m) {
  m.def("normalize(Tensor x, Tensor mean, Tensor std, Tensor scale, ScalarType dtype, bool channels_last) -> Tensor");
}

TORCH_LIBRARY_IMPL(fastcollate, CPU, m) { m.impl("normalize", &fastcollate::normalize_cpu); }
