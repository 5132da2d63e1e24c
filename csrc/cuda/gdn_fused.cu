// The Gated DeltaNet layer's fused small ops (contract: specpilot/gdn_fused.h): the prologue (conv
// update, SiLU, gates: ~12 torch kernels -> one launch) and the gated RMSNorm epilogue (~8 -> one).
// Each rounds where the torch path rounds, so only fp32 summation order differs from it.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "specpilot/gdn_fused.h"

namespace specpilot {
namespace gdn {
namespace {

constexpr int kPrologueThreads = 128;  // small CTAs: 8192 channels still spread over 64 SMs
constexpr int kNormWarps = 8;  // rows (token, head) per CTA of the epilogue, one warp each

__device__ __forceinline__ float bf(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float round_bf16(float x) { return __bfloat162float(__float2bfloat16(x)); }
__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }  // torch's opmath form

__device__ __forceinline__ float load_param(const void* p, bool is_bf16, int i) {
  return is_bf16 ? bf(static_cast<const __nv_bfloat16*>(p)[i]) : static_cast<const float*>(p)[i];
}

// One thread per conv channel: it rolls that channel's K-input window over the T tokens (registers
// hold the last K inputs) and writes the window record. Threads below T * hv also compute one gate
// pair each.
template <int K>
__global__ void __launch_bounds__(kPrologueThreads)
    gdn_prologue_kernel(const __nv_bfloat16* __restrict__ qkv, int64_t qkv_stride, const __nv_bfloat16* __restrict__ b_in,
                        int64_t b_stride, const __nv_bfloat16* __restrict__ a_in, int64_t a_stride,
                        const __nv_bfloat16* __restrict__ conv_state, const __nv_bfloat16* __restrict__ conv_weight,
                        const void* __restrict__ a_log, bool a_log_bf16, const void* __restrict__ dt_bias,
                        bool dt_bias_bf16, int channels, int hv, int tokens, __nv_bfloat16* __restrict__ window,
                        __nv_bfloat16* __restrict__ mixed, float* __restrict__ g, float* __restrict__ beta) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < channels) {
    const int c = i;
    float w[K], x[K];
#pragma unroll
    for (int j = 0; j < K; ++j) w[j] = bf(conv_weight[(int64_t)c * K + j]);
    __nv_bfloat16* record = window + (int64_t)c * (K - 1 + tokens);
#pragma unroll
    for (int j = 0; j < K - 1; ++j) {
      const __nv_bfloat16 v = conv_state[(int64_t)c * (K - 1) + j];
      record[j] = v;
      x[j] = bf(v);
    }
#pragma unroll 4  // overlaps the tokens' independent loads of a verify block
    for (int t = 0; t < tokens; ++t) {
      const __nv_bfloat16 v = qkv[(int64_t)t * qkv_stride + c];
      record[K - 1 + t] = v;
      x[K - 1] = bf(v);
      float acc = 0.f;
#pragma unroll
      for (int j = 0; j < K; ++j) acc = fmaf(w[j], x[j], acc);  // conv1d is a cross-correlation
      mixed[(int64_t)t * channels + c] = __float2bfloat16(silu(round_bf16(acc)));
#pragma unroll
      for (int j = 0; j < K - 1; ++j) x[j] = x[j + 1];
    }
  }
  if (i < tokens * hv) {
    const int t = i / hv, h = i % hv;
    const float b = bf(b_in[(int64_t)t * b_stride + h]);
    beta[i] = round_bf16(1.0f / (1.0f + expf(-b)));  // sigmoid in the model dtype, then .float()
    const float a = bf(a_in[(int64_t)t * a_stride + h]) + load_param(dt_bias, dt_bias_bf16, h);
    const float softplus = a > 20.0f ? a : log1pf(expf(a));  // torch's threshold (beta 1)
    g[i] = -expf(load_param(a_log, a_log_bf16, h)) * softplus;
  }
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// One warp per (row, head): the sum of squares over dv, then each lane its values.
__global__ void __launch_bounds__(kNormWarps * 32)
    gdn_gated_norm_kernel(const __nv_bfloat16* __restrict__ x, int64_t x_stride, const __nv_bfloat16* __restrict__ z,
                          int64_t z_stride, const void* __restrict__ weight, bool weight_bf16, int rows, int heads,
                          int dv, float eps, __nv_bfloat16* __restrict__ out) {
  const int item = blockIdx.x * kNormWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (item >= rows * heads) return;  // whole warps leave together
  const int r = item / heads, h = item % heads;
  const __nv_bfloat16* xr = x + (int64_t)r * x_stride + (int64_t)h * dv;
  const __nv_bfloat16* zr = z + (int64_t)r * z_stride + (int64_t)h * dv;
  __nv_bfloat16* o = out + (int64_t)r * heads * dv + (int64_t)h * dv;
  float squares = 0.f;
  for (int d = lane; d < dv; d += 32) {
    const float v = bf(xr[d]);
    squares = fmaf(v, v, squares);
  }
  const float inv = rsqrtf(warp_sum(squares) * (1.0f / dv) + eps);  // torch's mean: sum * (1 / n)
  for (int d = lane; d < dv; d += 32) {
    float p = load_param(weight, weight_bf16, d) * round_bf16(bf(xr[d]) * inv);
    if (weight_bf16) p = round_bf16(p);
    o[d] = __float2bfloat16(p * silu(bf(zr[d])));
  }
}

}  // namespace

int cuda_gdn_prologue(const uint16_t* qkv, int64_t qkv_stride, const uint16_t* b_in, int64_t b_stride,
                      const uint16_t* a_in, int64_t a_stride, const uint16_t* conv_state, const uint16_t* conv_weight,
                      const void* a_log, bool a_log_bf16, const void* dt_bias, bool dt_bias_bf16, int channels,
                      int width, int hv, int tokens, uint16_t* window, uint16_t* mixed, float* g, float* beta,
                      void* stream) {
  if (tokens < 1 || channels < 1 || hv < 1) return (int)cudaErrorInvalidValue;
  const int work = channels > tokens * hv ? channels : tokens * hv;
  const dim3 grid((work + kPrologueThreads - 1) / kPrologueThreads);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  using bf16 = __nv_bfloat16;
#define SP_GDN_PROLOGUE(K)                                                                                       \
  gdn_prologue_kernel<K><<<grid, kPrologueThreads, 0, s>>>(                                                     \
      reinterpret_cast<const bf16*>(qkv), qkv_stride, reinterpret_cast<const bf16*>(b_in), b_stride,             \
      reinterpret_cast<const bf16*>(a_in), a_stride, reinterpret_cast<const bf16*>(conv_state),                  \
      reinterpret_cast<const bf16*>(conv_weight), a_log, a_log_bf16, dt_bias, dt_bias_bf16, channels, hv, tokens, \
      reinterpret_cast<bf16*>(window), reinterpret_cast<bf16*>(mixed), g, beta)
  switch (width) {
    case 2: SP_GDN_PROLOGUE(2); break;
    case 3: SP_GDN_PROLOGUE(3); break;
    case 4: SP_GDN_PROLOGUE(4); break;
    default: return (int)cudaErrorInvalidValue;
  }
#undef SP_GDN_PROLOGUE
  return (int)cudaGetLastError();
}

int cuda_gdn_gated_norm(const uint16_t* x, int64_t x_stride, const uint16_t* z, int64_t z_stride, const void* weight,
                        bool weight_bf16, int rows, int heads, int dv, float eps, uint16_t* out, void* stream) {
  if (rows < 1 || heads < 1 || dv < 1) return (int)cudaErrorInvalidValue;
  const dim3 grid((rows * heads + kNormWarps - 1) / kNormWarps);
  gdn_gated_norm_kernel<<<grid, kNormWarps * 32, 0, static_cast<cudaStream_t>(stream)>>>(
      reinterpret_cast<const __nv_bfloat16*>(x), x_stride, reinterpret_cast<const __nv_bfloat16*>(z), z_stride,
      weight, weight_bf16, rows, heads, dv, eps, reinterpret_cast<__nv_bfloat16*>(out));
  return (int)cudaGetLastError();
}

}  // namespace gdn
}  // namespace specpilot
