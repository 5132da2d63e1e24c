// One-token bf16 GEMV with the input's prologue fused in: semantics in specpilot/gemv_m1.h.
//
// Geometry: 8 warps per CTA, a persistent grid of at most 2 CTAs per SM; warp w of the grid takes
// rows w, w + total_warps, ... (one row at a time, so the last wave is at most one row per warp
// long). A lane loads kUnroll 16-byte chunks of a row per step (4 KB per warp in flight) and
// prefetches the next step, across row boundaries, before it uses the current one.
// Every CTA computes the whole prologue (`in`, at most 32 KB) into shared memory after
// griddepcontrol.wait; its first weight loads are already in flight by then.
// Exactness: fp32 fmaf chains, columns ascending per lane, then a fixed butterfly: deterministic,
// not bit-identical to cuBLAS (another summation order). The prologues repeat add_rms_norm's /
// silu_mul's arithmetic exactly (fused_norm.cu, silu_mul.cu), so `in` is bit-identical to theirs.
#include <cuda_runtime.h>

#include "fused_bf16.cuh"
#include "gemv_prologue.cuh"
#include "sm90_device.cuh"
#include "specpilot/gemv_m1.h"
#include "split12_launch.h"  // sm_count, launch_kernel

namespace specpilot {
namespace gemv {
namespace {

using fused::f32_to_bf16;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kUnroll = 8;                    // 16-byte chunks per lane per step
constexpr int kStepVecs = kUnroll * 32;       // chunks of a row per warp step
constexpr int kCtasPerSm = 2;

using sm90::pdl_launch_dependents;
using sm90::pdl_wait;

// acc += w . x over 8 columns, ascending.
__device__ __forceinline__ float dot8(const uint4& w, const uint4& x, float acc) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t a = (&w.x)[i], b = (&x.x)[i];
    acc = __fmaf_rn(__uint_as_float(a << 16), __uint_as_float(b << 16), acc);
    acc = __fmaf_rn(__uint_as_float(a & 0xFFFF0000u), __uint_as_float(b & 0xFFFF0000u), acc);
  }
  return acc;
}

template <int P>
__global__ void __launch_bounds__(kThreads, kCtasPerSm) gemv_kernel(const GemvArgs a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ float scratch[33];
  uint4* in = reinterpret_cast<uint4*>(smem_raw);
  pdl_launch_dependents();  // the next kernel (if PDL) may start its own weight loads now

  const int lane = threadIdx.x % 32;
  const int kvec = a.k / 8;
  const int steps_per_row = (kvec + kStepVecs - 1) / kStepVecs;
  const int row_stride = gridDim.x * kWarps;
  const uint4* w = reinterpret_cast<const uint4*>(a.w);

  int row = blockIdx.x * kWarps + threadIdx.x / 32, step = 0;
  uint4 next[kUnroll];
  auto fetch = [&](int r, int s) {
    const uint4* src = w + (int64_t)r * kvec;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = s * kStepVecs + u * 32 + lane;
      if (c < kvec) next[u] = __ldcs(src + c);
    }
  };
  if (row < a.n) fetch(row, 0);

  pdl_wait();  // x, delta and the outputs belong to the previous kernel until now
  prologue<P>(a, kvec, scratch, [in](int v, const uint4& value) { in[v] = value; });
  __syncthreads();

  float acc = 0.0f;
  while (row < a.n) {
    uint4 cur[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) cur[u] = next[u];
    int next_row = row, next_step = step + 1;
    if (next_step == steps_per_row) {
      next_step = 0;
      next_row += row_stride;
    }
    if (next_row < a.n) fetch(next_row, next_step);  // in flight while `cur` is used
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = step * kStepVecs + u * 32 + lane;
      if (c < kvec) acc = dot8(cur[u], in[c], acc);
    }
    if (step == steps_per_row - 1) {
#pragma unroll
      for (int off = 16; off >= 1; off /= 2) acc += __shfl_xor_sync(0xFFFFFFFFu, acc, off);
      if (lane == 0) a.y[row] = f32_to_bf16(acc);
      acc = 0.0f;
    }
    row = next_row;
    step = next_step;
  }
}

}  // namespace

int cuda_gemv_m1(const GemvArgs& a, void* stream) {
  if (a.n < 1 || a.k < 8 || a.k % 8 != 0 || a.k > kMaxK) return (int)cudaErrorInvalidValue;
  if (a.prologue == kGemvAddNorm && (a.k > kMaxNormHidden || a.norm_w == nullptr)) return (int)cudaErrorInvalidValue;
  if (a.prologue < kGemvPlain || a.prologue > kGemvSiluMul) return (int)cudaErrorInvalidValue;
  const int rows_per_cta = kWarps;
  int grid = (a.n + rows_per_cta - 1) / rows_per_cta;
  grid = grid < kCtasPerSm * split12::sm_count() ? grid : kCtasPerSm * split12::sm_count();

  const size_t smem = (size_t)a.k * 2;
  const auto s = static_cast<cudaStream_t>(stream);
  switch (a.prologue) {
    case kGemvAddNorm: return split12::launch_kernel(gemv_kernel<kGemvAddNorm>, grid, kThreads, (int)smem, s, a.pdl, a);
    case kGemvSiluMul: return split12::launch_kernel(gemv_kernel<kGemvSiluMul>, grid, kThreads, (int)smem, s, a.pdl, a);
    default: return split12::launch_kernel(gemv_kernel<kGemvPlain>, grid, kThreads, (int)smem, s, a.pdl, a);
  }
}

}  // namespace gemv
}  // namespace specpilot
