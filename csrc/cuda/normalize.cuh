// Fused uint8 -> float32/float16/bfloat16 normalize (+ NCHW -> channels_last) for image batches.
// Torch-free on purpose: nvcc compiles it alone (CI has nvcc but no GPU, and checks it).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace fastcollate {

enum class OutKind : int { Float32 = 0, Float16 = 1, BFloat16 = 2 };

// in: N*C*H*W bytes, NCHW contiguous. out: the same elements, NCHW or channels_last (NHWC in
// memory). y = (x / scale[0] - mean[c]) / std[c], computed in float32, rounded to nearest (even).
// mean, std (C values each) and scale (one) are float32 in device memory: no host round trip.
// Launched on `stream`; returns the launch's error code.
cudaError_t launch_normalize_u8(const uint8_t* in, void* out, OutKind kind, int64_t n, int64_t c, int64_t hw,
                                bool channels_last, const float* mean, const float* std, const float* scale,
                                cudaStream_t stream);

}  // namespace fastcollate
