// Merging the decode attention's key splits (csrc/cuda/decode_attention.cu): merge_row, the merge
// arithmetic of the combine kernel over the fp32 workspace.
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "specpilot/decode_attention.h"

namespace specpilot {
namespace attention {

constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (lower 16 bits) = lo
  return *reinterpret_cast<const uint32_t*>(&v);
}

// One warp merges one output row over the `active` splits that had keys: out = sum_s 2^(lse_s - max)
// o_s / sum_s 2^(lse_s - max), summed in split order; lane l owns columns [l * D/32, (l+1) * D/32).
// load_lse(s) reads split s's lse (s < active only); load_part(s, live) this lane's columns of its
// partial (a float4 for D 128, a float2 for D 64), or zeros where !live (a predicated load). Every load goes out before the first one is used: the lse of every split (one per lane
// and 32 splits) and the partials of up to 32 splits (a fully unrolled, predicated group, so they
// stay in registers): one round trip (one more per further 32 splits), where a loop with each load
// behind its FMA waited out one per four splits (1.3 us more per call at T = 1 and 17 splits, 33 us
// per Qwen3-8B AR step: docs/PERF_NOTES.md). Splits past `active` add exact zeros.
template <int D, int kMax, class LoadLse, class LoadPart>
__device__ __forceinline__ void merge_row(int active, int lane, LoadLse load_lse, LoadPart load_part,
                                          uint16_t* dst) {
  static_assert(kMax <= 32 || kMax % 32 == 0, "splits come in groups of 32 (or one smaller group)");
  constexpr int kPer = D / 32;                   // consecutive columns per lane: 4 (D 128) or 2 (D 64)
  constexpr int kLanesSplits = (kMax + 31) / 32;
  constexpr int kGroup = kMax < 32 ? kMax : 32;  // partials loaded at once
  float x[kGroup][kPer];
  auto load_group = [&](int j) {
#pragma unroll
    for (int i = 0; i < kGroup; ++i) {
      const auto v = load_part(32 * j + i, 32 * j + i < active);
      if constexpr (kPer == 4)
        x[i][0] = v.x, x[i][1] = v.y, x[i][2] = v.z, x[i][3] = v.w;
      else
        x[i][0] = v.x, x[i][1] = v.y;
    }
  };

  float lse[kLanesSplits], mmax = -INFINITY;
#pragma unroll
  for (int j = 0; j < kLanesSplits; ++j) {
    const int s = lane + 32 * j;
    lse[j] = s < active ? load_lse(s) : -INFINITY;
  }
  load_group(0);
#pragma unroll
  for (int j = 0; j < kLanesSplits; ++j) mmax = fmaxf(mmax, lse[j]);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) mmax = fmaxf(mmax, __shfl_xor_sync(kFull, mmax, off));
  const float base = mmax == -INFINITY ? 0.f : mmax;
  float lsum = 0.f;
#pragma unroll
  for (int j = 0; j < kLanesSplits; ++j) {
    lse[j] = exp2f(lse[j] - base);  // now the split's weight (0 for splits past `active`)
    lsum += lse[j];
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) lsum += __shfl_xor_sync(kFull, lsum, off);

  float o[kPer];
#pragma unroll
  for (int c = 0; c < kPer; ++c) o[c] = 0.f;
#pragma unroll
  for (int j = 0; j < kLanesSplits; ++j) {
    if (32 * j >= active) break;
    if (j > 0) load_group(j);
#pragma unroll
    for (int i = 0; i < kGroup; ++i) {
      const float w = __shfl_sync(kFull, lse[j], i);
      if (32 * j + i < active) {  // only live splits add, in split order
#pragma unroll
        for (int c = 0; c < kPer; ++c) o[c] += w * x[i][c];
      }
    }
  }
  const float inv = lsum > 0.f ? 1.f / lsum : 0.f;
  if constexpr (kPer == 4)
    *reinterpret_cast<uint2*>(dst) = make_uint2(pack_bf16(o[0] * inv, o[1] * inv), pack_bf16(o[2] * inv, o[3] * inv));
  else
    *reinterpret_cast<uint32_t*>(dst) = pack_bf16(o[0] * inv, o[1] * inv);
}

}  // namespace attention
}  // namespace specpilot
