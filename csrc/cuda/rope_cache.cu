// qk_norm_rope_cache: per-head q/k RMSNorm (optional) + RoPE + the KV-cache write, one warp per
// (batch, token, head) row. Replaces, per attention layer: rms_norm, the weight multiply, RoPE's
// mul / neg / cat / mul / add, the q transpose and both index_copy_ into the cache.
//
// Exactness: the row arithmetic of rope_row.cuh (HF Qwen3/LLaMA order); v is copied bit for bit.
// Without norm weights (LLaMA) q/k/v are bit-identical to torch's eager formula; with them they
// differ only through the fp32 sum-of-squares order of the norm.
#include <cuda_runtime.h>

#include "rope_row.cuh"
#include "specpilot/fused_ops.h"
#include "split12_launch.h"  // launch_kernel (plain or PDL)

namespace specpilot {
namespace fused {
namespace {

constexpr int kWarpsPerBlock = 4;

// One warp per row; lane layout and arithmetic: rope_row.cuh.
template <int D>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    qk_norm_rope_cache_kernel(HeadRows q, HeadRows k, HeadRows v, const uint16_t* __restrict__ q_weight,
                              const uint16_t* __restrict__ k_weight, const uint16_t* __restrict__ cos,
                              const uint16_t* __restrict__ sin, const int64_t* __restrict__ positions, int batch,
                              int tokens, float eps, uint16_t* __restrict__ q_out, uint16_t* __restrict__ k_cache,
                              uint16_t* __restrict__ v_cache, int64_t slots) {
  constexpr int kHalf = D / 2, P = kHalf / 32;
  asm volatile("griddepcontrol.launch_dependents;\n" ::);  // no-ops unless launched with PDL
  asm volatile("griddepcontrol.wait;\n" ::: "memory");     // inputs and cache belong to the kernel before
  const int heads = q.heads + 2 * k.heads;
  const int64_t row = (int64_t)blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= (int64_t)batch * tokens * heads) return;  // whole warp
  const int lane = threadIdx.x % 32;
  const int h = (int)(row % heads);
  const int64_t bt = row / heads;
  const int t = (int)(bt % tokens), b = (int)(bt / tokens);

  // Which tensor this row belongs to, its head index there, and where the result goes.
  const bool is_q = h < q.heads, is_k = !is_q && h < q.heads + k.heads;
  // (fields picked one by one: a reference to the selected struct would copy all three to the stack)
  const uint16_t* base = is_q ? q.ptr : (is_k ? k.ptr : v.ptr);
  const int64_t batch_stride = is_q ? q.batch_stride : (is_k ? k.batch_stride : v.batch_stride);
  const int64_t token_stride = is_q ? q.token_stride : (is_k ? k.token_stride : v.token_stride);
  const int head = is_q ? h : (is_k ? h - q.heads : h - q.heads - k.heads);
  const uint16_t* x = base + b * batch_stride + t * token_stride + (int64_t)head * D;
  uint16_t* dst;
  if (is_q) {
    dst = q_out + (((int64_t)b * q.heads + head) * tokens + t) * D;
  } else {
    const int64_t pos = positions[t];
    if (pos < 0 || pos >= slots) return;  // index_copy_ would raise; never write out of bounds
    dst = (is_k ? k_cache : v_cache) + (((int64_t)b * k.heads + head) * slots + pos) * D;
  }

  if (!is_q && !is_k) {  // v: a plain copy
    uint16_t lo_bits[P], hi_bits[P];
    load_bits<P>(x + lane * P, lo_bits);
    load_bits<P>(x + kHalf + lane * P, hi_bits);
    store_bits<P>(dst + lane * P, lo_bits);
    store_bits<P>(dst + kHalf + lane * P, hi_bits);
    return;
  }
  uint16_t out_lo[P], out_hi[P];
  norm_rope_row<D>(x, is_q ? q_weight : k_weight, cos + (int64_t)t * D, sin + (int64_t)t * D, eps, lane, out_lo,
                   out_hi);
  store_bits<P>(dst + lane * P, out_lo);
  store_bits<P>(dst + kHalf + lane * P, out_hi);
}

}  // namespace

int cuda_qk_norm_rope_cache(HeadRows q, HeadRows k, HeadRows v, const uint16_t* q_weight, const uint16_t* k_weight,
                            const uint16_t* cos, const uint16_t* sin, const int64_t* positions, int batch,
                            int tokens, int head_dim, float eps, uint16_t* q_out, uint16_t* k_cache,
                            uint16_t* v_cache, int64_t slots, bool pdl, void* stream) {
  if (q.ptr == nullptr) q.heads = 0;
  if (v.heads != k.heads) return (int)cudaErrorInvalidValue;
  const int64_t rows = (int64_t)batch * tokens * (q.heads + 2 * k.heads);
  if (rows == 0) return 0;
  const int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (blocks > INT32_MAX) return (int)cudaErrorInvalidValue;
  auto go = [&](auto kernel) {
    return split12::launch_kernel(kernel, (int)blocks, kWarpsPerBlock * 32, 0, static_cast<cudaStream_t>(stream), pdl,
                                  q, k, v, q_weight, k_weight, cos, sin, positions, batch, tokens, eps, q_out, k_cache,
                                  v_cache, slots);
  };
  switch (head_dim) {
    case 64: return go(qk_norm_rope_cache_kernel<64>);
    case 128: return go(qk_norm_rope_cache_kernel<128>);
    case 256: return go(qk_norm_rope_cache_kernel<256>);
    default: return (int)cudaErrorInvalidValue;
  }
}

}  // namespace fused
}  // namespace specpilot
