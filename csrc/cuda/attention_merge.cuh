// Merging the decode attention's key splits (csrc/cuda/decode_attention.cu): merge_row, the one
// definition of the merge arithmetic, used by the combine kernel over the fp32 workspace and by the
// cluster merge over distributed shared memory (cluster_merge), and the DSMEM helpers it needs.
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "sm90_device.cuh"
#include "specpilot/decode_attention.h"

namespace specpilot {
namespace attention {

constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (lower 16 bits) = lo
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Distributed shared memory (sm_90 clusters): the address of the same shared variable in CTA
// `rank` of this cluster, and loads from it.
__device__ __forceinline__ uint32_t cluster_map(uint32_t smem_addr, int rank) {
  uint32_t out;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(out) : "r"(smem_addr), "r"(rank));
  return out;
}
__device__ __forceinline__ float ld_cluster(uint32_t addr) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ float4 ld_cluster4(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ float2 ld_cluster2(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr) : "memory");
  return v;
}
// Every thread of the cluster: writes before (shared memory included) are visible after.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}

// One warp merges one output row over the `active` splits that had keys: out = sum_s 2^(lse_s - max)
// o_s / sum_s 2^(lse_s - max), summed in split order; lane l owns columns [l * D/32, (l+1) * D/32).
// load_lse(s) reads split s's lse (s < active only); load_part(s, live) this lane's columns of its
// partial (a float4 for D 128, a float2 for D 64), or zeros where !live (a predicated load). Every load goes out before the first one is used: the lse of every split (one per lane
// and 32 splits) and the partials of up to 32 splits (a fully unrolled, predicated group, so they
// stay in registers): one round trip (one more per further 32 splits), where a loop with each load
// behind its FMA waited out one per four splits (1.3 us more per call at T = 1 and 17 splits, 33 us
// per Qwen3-8B AR step: docs/PERF_NOTES.md, eleventh session). The one definition of the merge
// arithmetic, for the combine kernel (kMax = kMaxSplits) and the cluster merge (kMax =
// kMaxClusterSplits): splits past `active` add exact zeros, so both give the same bits.
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

// The cluster merge (see the top of this file): once every CTA of the cluster has left its
// partial (o [rows][Pitch], lse [rows]) in its shared memory at cpart / clse, CTA `split` (its
// cluster rank: the cluster spans grid.x) merges rows [split * per, (split + 1) * per), a warp per
// row, with merge_row (the combine kernel's arithmetic), reading every split's partial over DSMEM.
// Every thread of the cluster calls it (CTAs without keys and warps without rows included).
template <int D, int Pitch, int kWarps, class OutRow>
__device__ __forceinline__ void cluster_merge(const DecodeAttentionArgs& a, const float* cpart, const float* clse,
                                              int rows, int active, int split, int warp, int lane, OutRow out_row) {
  cluster_sync();  // every split's partial is in its CTA's shared memory
  const int per = (rows + a.num_splits - 1) / a.num_splits;
  const int r_end = min(rows, (split + 1) * per);
  const uint32_t part0 = sm90::smem_u32(cpart), lse0 = sm90::smem_u32(clse);
  for (int r = split * per + warp; r < r_end; r += kWarps) {
    const uint32_t row_o = part0 + 4u * (r * Pitch + lane * (D / 32));
    merge_row<D, kMaxClusterSplits>(
        active, lane, [&](int s) { return ld_cluster(cluster_map(lse0 + 4u * r, s)); },
        [&](int s, bool live) {
          if constexpr (D / 32 == 4)
            return live ? ld_cluster4(cluster_map(row_o, s)) : make_float4(0.f, 0.f, 0.f, 0.f);
          else
            return live ? ld_cluster2(cluster_map(row_o, s)) : make_float2(0.f, 0.f);
        },
        a.out + out_row(r) * D + lane * (D / 32));
  }
  cluster_sync();  // no CTA exits while another may still read its shared memory
}

}  // namespace attention
}  // namespace specpilot
