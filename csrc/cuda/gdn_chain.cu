// The Gated DeltaNet chain kernel (contract: specpilot/gdn.h). One CTA per (value head, 32-column
// slice of the state); DK threads, thread i holding row i of the slice (32 fp32 registers) for the
// whole block of tokens, so the state is read once and each token's state written once.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "specpilot/gdn.h"

namespace specpilot {
namespace gdn {
namespace {

constexpr int kCols = 32;  // state columns (value dims) per CTA

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// The sum over the CTA's DK threads of one value each; every thread gets it.
template <int DK>
__device__ __forceinline__ float block_sum(float x, float* scratch) {
  constexpr int kWarps = DK / 32;
  x = warp_sum(x);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = x;
  __syncthreads();
  float total = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) total += scratch[w];
  __syncthreads();
  return total;
}

// col[c] = the sum over the CTA's DK rows of part[c], for the kCols columns (col in shared memory,
// visible to every thread on return).
template <int DK>
__device__ __forceinline__ void column_sums(float (&part)[kCols], float (*scratch)[kCols], float* col) {
  constexpr int kWarps = DK / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    const float total = warp_sum(part[c]);
    if (lane == c) scratch[warp][c] = total;
  }
  __syncthreads();
  if (threadIdx.x < kCols) {
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total += scratch[w][threadIdx.x];
    col[threadIdx.x] = total;
  }
  __syncthreads();
}

template <int DK>
__global__ void __launch_bounds__(DK) gdn_chain_kernel(const __nv_bfloat16* __restrict__ mixed, int64_t row_stride,
                                                       int nk, int hv, int dv, const float* __restrict__ g,
                                                       const float* __restrict__ beta,
                                                       const float* __restrict__ state_in,
                                                       float* __restrict__ states_out,
                                                       __nv_bfloat16* __restrict__ out, int tokens, float scale) {
  __shared__ float scratch[DK / 32][kCols];
  __shared__ float reduce[DK / 32];
  __shared__ float col[kCols];
  __shared__ float value[kCols];
  const int h = blockIdx.x, c0 = blockIdx.y * kCols, i = threadIdx.x;
  const int key_head = h / (hv / nk);
  const int key_dim = nk * DK;
  const int64_t head_offset = (int64_t)h * DK * dv + (int64_t)i * dv + c0;  // row i of this slice

  float s[kCols];
  const float4* src = reinterpret_cast<const float4*>(state_in + head_offset);
#pragma unroll
  for (int c = 0; c < kCols / 4; ++c) {
    const float4 x = src[c];
    s[4 * c] = x.x;
    s[4 * c + 1] = x.y;
    s[4 * c + 2] = x.z;
    s[4 * c + 3] = x.w;
  }

  for (int t = 0; t < tokens; ++t) {
    const __nv_bfloat16* row = mixed + (int64_t)t * row_stride;
    float q = __bfloat162float(row[key_head * DK + i]);
    float k = __bfloat162float(row[key_dim + key_head * DK + i]);
    if (i < kCols) value[i] = __bfloat162float(row[2 * key_dim + h * dv + c0 + i]);
    const float kk = block_sum<DK>(k * k, reduce);  // its barriers also publish value[]
    const float qq = block_sum<DK>(q * q, reduce);
    k *= rsqrtf(kk + 1e-6f);
    q *= rsqrtf(qq + 1e-6f) * scale;
    const float decay = expf(g[(int64_t)t * hv + h]);
    const float b = beta[(int64_t)t * hv + h];

    float part[kCols];
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      s[c] *= decay;
      part[c] = s[c] * k;
    }
    column_sums<DK>(part, scratch, col);  // col = S^T k: what the state predicts for k
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const float u = b * (value[c] - col[c]);
      s[c] = fmaf(k, u, s[c]);
      part[c] = s[c] * q;
    }
    __syncthreads();  // every thread has read col before it is rewritten
    column_sums<DK>(part, scratch, col);  // col = S^T q: the output
    if (i < kCols) out[((int64_t)t * hv + h) * dv + c0 + i] = __float2bfloat16(col[i]);
    float4* dst = reinterpret_cast<float4*>(states_out + (int64_t)t * hv * DK * dv + head_offset);
#pragma unroll
    for (int c = 0; c < kCols / 4; ++c) dst[c] = make_float4(s[4 * c], s[4 * c + 1], s[4 * c + 2], s[4 * c + 3]);
    __syncthreads();  // col and value are rewritten by the next token
  }
}

}  // namespace

int cuda_gdn_chain(const uint16_t* mixed, int64_t row_stride, int nk, int hv, int dk, int dv, const float* g,
                   const float* beta, const float* state_in, float* states_out, uint16_t* out, int tokens,
                   float scale, void* stream) {
  if (tokens < 1 || nk < 1 || hv % nk != 0 || dv % kCols != 0) return (int)cudaErrorInvalidValue;
  const dim3 grid(hv, dv / kCols);
  const auto* x = reinterpret_cast<const __nv_bfloat16*>(mixed);
  auto* y = reinterpret_cast<__nv_bfloat16*>(out);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (dk) {
    case 64:
      gdn_chain_kernel<64><<<grid, 64, 0, s>>>(x, row_stride, nk, hv, dv, g, beta, state_in, states_out, y, tokens,
                                               scale);
      break;
    case 128:
      gdn_chain_kernel<128><<<grid, 128, 0, s>>>(x, row_stride, nk, hv, dv, g, beta, state_in, states_out, y,
                                                 tokens, scale);
      break;
    default:
      return (int)cudaErrorInvalidValue;
  }
  return (int)cudaGetLastError();
}

}  // namespace gdn
}  // namespace specpilot
