#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "normalize.cuh"

namespace fastcollate {
namespace {

__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(__half* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

// One thread per pixel (n, hw), all its channels: reads of a channel plane are coalesced across
// neighbouring threads, and channels_last writes are contiguous per thread.
template <typename OutT, bool kChannelsLast>
__global__ void normalize_u8_kernel(const uint8_t* __restrict__ in, OutT* __restrict__ out, int64_t n, int64_t c,
                                    int64_t hw, const float* __restrict__ mean, const float* __restrict__ std,
                                    const float* __restrict__ scale) {
  const int64_t pixels = n * hw;
  const float s = *scale;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < pixels;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t img = i / hw;
    const int64_t pix = i - img * hw;
    const uint8_t* src = in + img * c * hw + pix;
    for (int64_t ch = 0; ch < c; ++ch) {
      // same operations, same order as the torch path: divide, subtract, divide (IEEE fp32)
      const float v = (static_cast<float>(src[ch * hw]) / s - mean[ch]) / std[ch];
      const int64_t dst = kChannelsLast ? i * c + ch : img * c * hw + ch * hw + pix;
      store(out + dst, v);
    }
  }
}

template <typename OutT>
cudaError_t launch_typed(const uint8_t* in, void* out, int64_t n, int64_t c, int64_t hw, bool channels_last,
                         const float* mean, const float* std, const float* scale, cudaStream_t stream) {
  const int64_t pixels = n * hw;
  if (pixels == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int64_t blocks = (pixels + kThreads - 1) / kThreads;
  const unsigned grid = static_cast<unsigned>(blocks < 65535 * 8 ? blocks : 65535 * 8);
  if (channels_last) {
    normalize_u8_kernel<OutT, true><<<grid, kThreads, 0, stream>>>(in, static_cast<OutT*>(out), n, c, hw, mean, std,
                                                                    scale);
  } else {
    normalize_u8_kernel<OutT, false><<<grid, kThreads, 0, stream>>>(in, static_cast<OutT*>(out), n, c, hw, mean, std,
                                                                     scale);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_normalize_u8(const uint8_t* in, void* out, OutKind kind, int64_t n, int64_t c, int64_t hw,
                                bool channels_last, const float* mean, const float* std, const float* scale,
                                cudaStream_t stream) {
  switch (kind) {
    case OutKind::Float32:
      return launch_typed<float>(in, out, n, c, hw, channels_last, mean, std, scale, stream);
    case OutKind::Float16:
      return launch_typed<__half>(in, out, n, c, hw, channels_last, mean, std, scale, stream);
    case OutKind::BFloat16:
      return launch_typed<__nv_bfloat16>(in, out, n, c, hw, channels_last, mean, std, scale, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace fastcollate
