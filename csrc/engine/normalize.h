// fastcollate::normalize, the torch op behind transforms.Normalize:
//   normalize(Tensor x, Tensor mean, Tensor std, Tensor scale, ScalarType dtype, bool channels_last) -> Tensor
// y = (x / scale - mean[c]) / std[c] for uint8 x ([N, C, H, W] or [C, H, W]), in fp32 (true
// divisions), cast to dtype (float32, float16, bfloat16), channels_last on request. The schema and
// the CPU kernel are always built (engine/normalize.cpp); the CUDA kernel is registered by
// cuda/normalize_op.cpp in CUDA builds; the fake (meta) kernel from Python
// (fastcollate/transforms.py). The constants are tensors on x's device, the scale included: CUDA
// turns a division by a scalar into a multiplication by its reciprocal, which can differ from a
// true division in the last bit.
#pragma once

#include <ATen/ATen.h>

namespace fastcollate {

// The op's argument checks, with what was received.
void check_normalize_args(const at::Tensor& x, const at::Tensor& mean, const at::Tensor& std, const at::Tensor& scale,
                          at::ScalarType dtype, bool channels_last);

// The op as ATen operations, in the order of transforms.Normalize's reference: the CPU kernel,
// and the CUDA kernel's route for inputs it does not read (non-contiguous x).
at::Tensor normalize_aten(const at::Tensor& x, const at::Tensor& mean, const at::Tensor& std, const at::Tensor& scale,
                          at::ScalarType dtype, bool channels_last);

}  // namespace fastcollate
