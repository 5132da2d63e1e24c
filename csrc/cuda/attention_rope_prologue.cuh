// The decode attention's rope prologue (RopePrologue in csrc/include/specpilot/decode_attention.h):
// a one-token step's q/k norm, RoPE and cache write done by the attention's split kernel instead of
// a qk_norm_rope_cache launch before it, with the same row arithmetic (rope_row.cuh), so the same bits.
#pragma once

#include <cstdint>

#include "rope_row.cuh"
#include "specpilot/decode_attention.h"

namespace specpilot {
namespace attention {

// Called by every warp of the CTA (kWarps of them) after the PDL wait. The g query rows of KV head
// `kvh`, normed and rotated from the QKV projection's output, go into rows 0..g-1 of the 16-row Q
// tile `sq` (kPitch bf16 per row; rows g..15 zero). The CTA whose keys end at slot last[0]
// (`writer`, CTA-uniform) also writes this step's k (normed, rotated) and v into the cache there,
// then fences and syncs, so that its own cp.async loads of that slot, issued after this, see them.
template <int D, int kPitch, int kWarps>
__device__ __forceinline__ void rope_prologue(const DecodeAttentionArgs& a, uint16_t* sq, int b, int kvh, int g,
                                              int warp, int lane, bool writer) {
  using fused::load_bits;
  using fused::norm_rope_row;
  using fused::store_bits;
  constexpr int P = D / 64, kHalf = D / 2;
  const RopePrologue& rp = a.rope;
  const uint16_t* x = rp.qkv + b * rp.qkv_batch_stride;
  for (int r = warp; r < 16; r += kWarps) {
    uint16_t lo[P] = {}, hi[P] = {};
    if (r < g) norm_rope_row<D>(x + static_cast<long long>(kvh * g + r) * D, rp.q_weight, rp.cos, rp.sin, rp.eps,
                                lane, lo, hi);
    store_bits<P>(sq + r * kPitch + lane * P, lo);
    store_bits<P>(sq + r * kPitch + kHalf + lane * P, hi);
  }
  if (!writer) return;
  const long long pos = a.last[0];
  if (pos >= 0 && pos < rp.slots && warp < 2) {  // warp 0: k, warp 1: v
    const long long at = warp == 0 ? b * a.k_stride[0] + kvh * a.k_stride[1] + pos * a.k_stride[2]
                                   : b * a.v_stride[0] + kvh * a.v_stride[1] + pos * a.v_stride[2];
    const uint16_t* src = x + static_cast<long long>(a.q_heads + warp * a.kv_heads + kvh) * D;
    uint16_t lo[P], hi[P];
    if (warp == 0) {  // k: normed and rotated
      norm_rope_row<D>(src, rp.k_weight, rp.cos, rp.sin, rp.eps, lane, lo, hi);
    } else {          // v: copied
      load_bits<P>(src + lane * P, lo);
      load_bits<P>(src + kHalf + lane * P, hi);
    }
    uint16_t* dst = (warp == 0 ? rp.k_cache : rp.v_cache) + at;
    store_bits<P>(dst + lane * P, lo);
    store_bits<P>(dst + kHalf + lane * P, hi);
  }
  __threadfence();
  __syncthreads();
}

}  // namespace attention
}  // namespace specpilot
