// The fused prologues of the one-token GEMV (gemv_m1.cu): each CTA computes
// the GEMV's input vector `in` (K bf16 values, 16-byte vectors of 8) and hands every vector to
// store(v, value), which puts it in the kernel's own shared-memory layout.
//   add_norm:  add_rms_norm's arithmetic and summation order (fused_norm.cu), so `in` is
//              bit-identical to its `normed`; CTA 0 also writes the sum to a.sum_out.
//   silu_mul:  silu_mul's arithmetic (silu_mul.cu) over x = [gate | up].
//   plain:     in = x.
// Call after griddepcontrol.wait (x and delta come from the previous kernel); __syncthreads after.
#pragma once

#include "fused_bf16.cuh"
#include "specpilot/gemv_m1.h"

namespace specpilot {
namespace gemv {

constexpr int kNormVecsPerThread = 4;  // fused_norm.cu kVecsPerThread

// add_rms_norm_kernel's order: a virtual block of `vthreads` threads (its launch formula), thread t
// owning vectors t, t + vthreads, ...; the real block (blockDim.x >= vthreads) adds 0.0 for the rest.
template <class Store>
__device__ __forceinline__ void prologue_add_norm(const GemvArgs& a, int kvec, float* scratch, Store store) {
  using fused::round_bf16;
  using fused::vec_get;
  using fused::vec_set;
  const uint4* x = reinterpret_cast<const uint4*>(a.x);
  const uint4* delta = reinterpret_cast<const uint4*>(a.delta);
  const uint4* weight = reinterpret_cast<const uint4*>(a.norm_w);
  uint4* sum = reinterpret_cast<uint4*>(a.sum_out);
  int vthreads = ((kvec + 1) / 2 + 31) / 32 * 32;
  vthreads = vthreads < 32 ? 32 : vthreads;
  const int t = threadIdx.x;
  uint4 s[kNormVecsPerThread];
  float sq = 0.0f;
#pragma unroll
  for (int i = 0; i < kNormVecsPerThread; ++i) {
    const int v = t + i * vthreads;
    if (t >= vthreads || v >= kvec) break;
    s[i] = x[v];
    if (delta != nullptr) {
      const uint4 d = delta[v];
#pragma unroll
      for (int j = 0; j < 8; ++j) vec_set(s[i], j, vec_get(s[i], j) + vec_get(d, j));
      if (sum != nullptr && blockIdx.x == 0) sum[v] = s[i];
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float f = vec_get(s[i], j);
      sq = fmaf(f, f, sq);
    }
  }
  const float rstd = rsqrtf(fused::block_sum(sq, scratch) * (1.0f / (float)a.k) + a.eps);
#pragma unroll
  for (int i = 0; i < kNormVecsPerThread; ++i) {
    const int v = t + i * vthreads;
    if (t >= vthreads || v >= kvec) break;
    const uint4 w = weight[v];
    uint4 out = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
    for (int j = 0; j < 8; ++j) vec_set(out, j, round_bf16(vec_get(s[i], j) * rstd) * vec_get(w, j));
    store(v, out);
  }
}

template <class Store>
__device__ __forceinline__ void prologue_silu_mul(const GemvArgs& a, int kvec, Store store) {
  using fused::vec_get;
  using fused::vec_set;
  const uint4* gate = reinterpret_cast<const uint4*>(a.x);
  const uint4* up = gate + kvec;
  for (int v = threadIdx.x; v < kvec; v += blockDim.x) {
    const uint4 g = gate[v], u = up[v];
    uint4 out = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
    for (int j = 0; j < 8; ++j) vec_set(out, j, fused::silu_times(vec_get(g, j), vec_get(u, j)));
    store(v, out);
  }
}

template <int P, class Store>
__device__ __forceinline__ void prologue(const GemvArgs& a, int kvec, float* scratch, Store store) {
  if constexpr (P == kGemvAddNorm) {
    prologue_add_norm(a, kvec, scratch, store);
  } else if constexpr (P == kGemvSiluMul) {
    prologue_silu_mul(a, kvec, store);
  } else {
    const uint4* x = reinterpret_cast<const uint4*>(a.x);
    for (int v = threadIdx.x; v < kvec; v += blockDim.x) store(v, x[v]);
  }
}

}  // namespace gemv
}  // namespace specpilot
