// One head row of qk_norm_rope_cache's arithmetic, by one warp: the per-head RMSNorm (optional) and
// RoPE of a bf16 q or k row. Shared by the rope / cache-write kernel (rope_cache.cu) and the decode
// attention's rope prologue (decode_attention.cu), so that both produce the same bits.
//
// Per element (HF Qwen3/LLaMA order; x = the bf16 row):
//   norm:  n = bf16( bf16(x * rsqrt(mean(x^2) + eps)) * w )       (fp32 statistics)
//   RoPE:  out = bf16( bf16(n * cos) + bf16(rotate_half(n) * sin) ),  rotate_half(n) = cat(-n[D/2:], n[:D/2])
// Lane l holds elements [l*P, l*P + P) of the first half ("lo") and the same of the second ("hi"),
// P = D / 64, so rotate_half pairs stay in one lane.
#pragma once

#include <cstdint>

#include "fused_bf16.cuh"

namespace specpilot {
namespace fused {

// P consecutive bf16 (P = 1, 2 or 4) as one load / store.
template <int P>
struct Pack;
template <>
struct Pack<1> {
  using T = uint16_t;
};
template <>
struct Pack<2> {
  using T = uint32_t;
};
template <>
struct Pack<4> {
  using T = uint2;
};

template <int P>
__device__ __forceinline__ void load_bits(const uint16_t* p, uint16_t (&out)[P]) {
  const typename Pack<P>::T v = *reinterpret_cast<const typename Pack<P>::T*>(p);
  const uint16_t* b = reinterpret_cast<const uint16_t*>(&v);
#pragma unroll
  for (int i = 0; i < P; ++i) out[i] = b[i];
}

template <int P>
__device__ __forceinline__ void store_bits(uint16_t* p, const uint16_t (&in)[P]) {
  typename Pack<P>::T v;
  uint16_t* b = reinterpret_cast<uint16_t*>(&v);
#pragma unroll
  for (int i = 0; i < P; ++i) b[i] = in[i];
  *reinterpret_cast<typename Pack<P>::T*>(p) = v;
}

// out = rope(norm(x)) for this lane's elements; w == nullptr: no norm (LLaMA). cos / sin: the
// token's [D] rows.
template <int D>
__device__ __forceinline__ void norm_rope_row(const uint16_t* x, const uint16_t* w, const uint16_t* cos,
                                              const uint16_t* sin, float eps, int lane, uint16_t (&out_lo)[D / 64],
                                              uint16_t (&out_hi)[D / 64]) {
  constexpr int kHalf = D / 2, P = D / 64;
  uint16_t lo_bits[P], hi_bits[P];
  load_bits<P>(x + lane * P, lo_bits);
  load_bits<P>(x + kHalf + lane * P, hi_bits);
  float lo[P], hi[P];
#pragma unroll
  for (int i = 0; i < P; ++i) {
    lo[i] = bf16_to_f32(lo_bits[i]);
    hi[i] = bf16_to_f32(hi_bits[i]);
  }
  if (w != nullptr) {  // warp-uniform
    float sq = 0.0f;
#pragma unroll
    for (int i = 0; i < P; ++i) sq = fmaf(hi[i], hi[i], fmaf(lo[i], lo[i], sq));
    const float rstd = rsqrtf(warp_sum(sq) * (1.0f / D) + eps);
    uint16_t w_lo[P], w_hi[P];
    load_bits<P>(w + lane * P, w_lo);
    load_bits<P>(w + kHalf + lane * P, w_hi);
#pragma unroll
    for (int i = 0; i < P; ++i) {
      lo[i] = round_bf16(round_bf16(lo[i] * rstd) * bf16_to_f32(w_lo[i]));
      hi[i] = round_bf16(round_bf16(hi[i] * rstd) * bf16_to_f32(w_hi[i]));
    }
  }
  uint16_t c_lo[P], c_hi[P], s_lo[P], s_hi[P];
  load_bits<P>(cos + lane * P, c_lo);
  load_bits<P>(cos + kHalf + lane * P, c_hi);
  load_bits<P>(sin + lane * P, s_lo);
  load_bits<P>(sin + kHalf + lane * P, s_hi);
#pragma unroll
  for (int i = 0; i < P; ++i) {
    const float a_lo = round_bf16(lo[i] * bf16_to_f32(c_lo[i])), r_lo = round_bf16(-hi[i] * bf16_to_f32(s_lo[i]));
    const float a_hi = round_bf16(hi[i] * bf16_to_f32(c_hi[i])), r_hi = round_bf16(lo[i] * bf16_to_f32(s_hi[i]));
    out_lo[i] = f32_to_bf16(a_lo + r_lo);
    out_hi[i] = f32_to_bf16(a_hi + r_hi);
  }
}

}  // namespace fused
}  // namespace specpilot
