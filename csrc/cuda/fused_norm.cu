// add_rms_norm: the residual add fused with the next RMSNorm, one block per row.
//   sum    = bf16(x + delta)                                   (delta optional: plain RMSNorm)
//   normed = bf16( bf16(sum * rsqrt(mean(sum^2) + eps)) * weight )
// zero_centred_add_rms_norm: the same add, then the hybrid targets' norm (transformers'
// Qwen3NextRMSNorm: fp32 throughout, weight 1 + w, one rounding at the end)
//   normed = bf16( (sum * rsqrt(mean(sum^2) + eps)) * (1 + weight) )
// Exactness: HF Qwen3/LLaMA RMSNorm arithmetic (fp32 statistics of the bf16 sum, round to bf16, then
// the bf16 weight multiply rounded to bf16). `sum` is bit-identical to torch's bf16 add; `normed`
// differs from torch only through the fp32 sum-of-squares order (within 1 bf16 ulp in practice).
// Launched with PDL: it lets the next kernel start at once (a skinny GEMM then streams its first
// weights while this runs) and waits for the previous one before reading anything.
#include <cuda_runtime.h>

#include "fused_bf16.cuh"
#include "sm90_device.cuh"
#include "specpilot/fused_ops.h"
#include "split12_launch.h"  // launch_kernel

namespace specpilot {
namespace fused {
namespace {

constexpr int kVecsPerThread = 4;  // 16-byte vectors a thread keeps in registers between the passes

template <bool kZeroCentred>
__global__ void add_rms_norm_kernel(const uint4* __restrict__ x, const uint4* __restrict__ delta,
                                    const uint4* __restrict__ weight, int vecs, float inv_hidden, float eps,
                                    uint4* __restrict__ sum, uint4* __restrict__ normed) {
  __shared__ float scratch[33];
  sm90::pdl_launch_dependents();
  sm90::pdl_wait();  // x and delta are the previous kernel's outputs
  const int64_t row = (int64_t)blockIdx.x * vecs;
  uint4 s[kVecsPerThread], w[kVecsPerThread];
  float sq = 0.0f;
#pragma unroll
  for (int i = 0; i < kVecsPerThread; ++i) {
    const int v = threadIdx.x + i * blockDim.x;
    if (v >= vecs) break;
    w[i] = weight[v];  // loaded with the row, not after the reduction: one memory latency less
    s[i] = x[row + v];
    if (delta != nullptr) {
      const uint4 d = delta[row + v];
#pragma unroll
      for (int j = 0; j < 8; ++j) vec_set(s[i], j, vec_get(s[i], j) + vec_get(d, j));
      if (sum != nullptr) sum[row + v] = s[i];
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float f = vec_get(s[i], j);
      sq = fmaf(f, f, sq);
    }
  }
  // mean as torch's mean reduction: sum * (1 / n) (exact for power-of-two hidden sizes).
  const float rstd = rsqrtf(block_sum(sq, scratch) * inv_hidden + eps);
#pragma unroll
  for (int i = 0; i < kVecsPerThread; ++i) {
    const int v = threadIdx.x + i * blockDim.x;
    if (v >= vecs) break;
    uint4 out = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float n = vec_get(s[i], j) * rstd;
      vec_set(out, j, kZeroCentred ? n * (1.0f + vec_get(w[i], j)) : round_bf16(n) * vec_get(w[i], j));
    }
    normed[row + v] = out;
  }
}

template <bool kZeroCentred>
int launch_add_rms_norm(const uint16_t* x, const uint16_t* delta, const uint16_t* weight, int64_t rows, int hidden,
                        float eps, uint16_t* sum, uint16_t* normed, void* stream) {
  if (hidden % 8 != 0 || hidden > kMaxHidden || rows > INT32_MAX) return (int)cudaErrorInvalidValue;
  if (rows == 0) return 0;
  const int vecs = hidden / 8;
  // ~2 vectors per thread: enough loads in flight per thread, and a whole row in one block.
  int threads = ((vecs + 1) / 2 + 31) / 32 * 32;
  threads = threads < 32 ? 32 : (threads > 1024 ? 1024 : threads);
  return split12::launch_kernel(add_rms_norm_kernel<kZeroCentred>, dim3((unsigned)rows), threads, 0,
                                static_cast<cudaStream_t>(stream), true, reinterpret_cast<const uint4*>(x),
                                reinterpret_cast<const uint4*>(delta), reinterpret_cast<const uint4*>(weight), vecs,
                                1.0f / (float)hidden, eps, reinterpret_cast<uint4*>(sum),
                                reinterpret_cast<uint4*>(normed));
}

}  // namespace

int cuda_add_rms_norm(const uint16_t* x, const uint16_t* delta, const uint16_t* weight, int64_t rows, int hidden,
                      float eps, uint16_t* sum, uint16_t* normed, void* stream) {
  return launch_add_rms_norm<false>(x, delta, weight, rows, hidden, eps, sum, normed, stream);
}

int cuda_zero_centred_add_rms_norm(const uint16_t* x, const uint16_t* delta, const uint16_t* weight, int64_t rows,
                                   int hidden, float eps, uint16_t* sum, uint16_t* normed, void* stream) {
  return launch_add_rms_norm<true>(x, delta, weight, rows, hidden, eps, sum, normed, stream);
}

}  // namespace fused
}  // namespace specpilot
