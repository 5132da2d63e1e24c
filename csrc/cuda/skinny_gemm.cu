// Skinny bf16 GEMM on tensor cores (M <= 16): semantics in specpilot/skinny_gemm.h.
//
// Swap-AB: the weight is the MMA's A side (mma.m16n8k16, 16 rows per tile), the tokens its N side
// (one or two n8 tiles). The dot product runs over k, so any permutation of k applied to A and B
// alike is free: lane (g, t) = (lane / 4, lane % 4) holds columns 32i + 8t .. 32i + 8t + 7 (i = 0..3)
// of a 128-column span for rows g and g + 8, loaded as four 16-byte vectors per row. The four lanes
// of a row then read 64 contiguous bytes per load instruction (whole sectors), and word q of a
// lane's 16 words feeds mma k-step q / 2 as A's k slots {2t, 2t+1} (q even) or {2t+8, 2t+9} (q odd);
// B (x) takes the same words at the same columns, so no data moves between lanes.
//
// Work split: a CTA of 4 warps owns 64 rows (warp w: rows 16w .. 16w + 15) and one slice of K
// (grid.y slices). x for the slice goes to shared memory 512 columns (a stage) at a time by
// cp.async into two buffers, so stage s + 1 lands while stage s is used (rows padded by 64 bytes:
// the fragment loads are free of bank conflicts); every warp keeps two spans of weights (8 KB) in
// flight in registers, across stage boundaries. With one slice the CTA writes y; with several,
// each writes fp32 partials and the last CTA of its row block (an atomic counter it resets) sums
// them in slice order: deterministic, and no second kernel.
//
// Speed (H200, docs/PERF_NOTES.md, sixth session): at M = 2 on par with cuBLAS (O 11.7 vs 13.1 us),
// at M = 8..16 slower (QKV M = 16: 22.6 vs 15.2 us); Nsight Compute puts most stall cycles on the
// shared-memory fragment loads feeding the mma (about 2.7 warps per scheduler to hide them). So
// models/skinny_linear.py leaves it off by default.
#include <cuda_runtime.h>

#include "fused_bf16.cuh"  // f32_to_bf16
#include "sm90_device.cuh"
#include "specpilot/skinny_gemm.h"
#include "split12_launch.h"  // sm_count, launch_kernel

namespace specpilot {
namespace skinny {
namespace {

constexpr int kWarps = kRowsPerCta / 16;
constexpr int kThreads = kWarps * 32;
constexpr int kSpan = 128;                      // columns per warp step
constexpr int kStageCols = 512;                 // x columns per shared-memory stage (two buffers)
constexpr int kSpansPerStage = kStageCols / kSpan;
constexpr int kDepth = 2;                       // spans of weights in flight per warp
constexpr int kXRow = kStageCols + 32;          // bf16 per staged x row: +64 bytes against bank conflicts

using sm90::pdl_launch_dependents;
using sm90::pdl_wait;

// Word q (0..15) of four 16-byte vectors.
__device__ __forceinline__ uint32_t word(const uint4* v, int q) { return (&v[q / 4].x)[q % 4]; }

// Issue the copies of x columns [c0, c0 + kStageCols) of the NT * 8 token rows into `xs` (zeros
// past M and past the slice end `c_end`), as one cp.async group (16-byte copies, L2 only).
template <int NT>
__device__ __forceinline__ void stage_x(const SkinnyArgs& a, int c0, int c_end, uint16_t* xs) {
  constexpr int kVecs = kStageCols / 8;
  for (int v = threadIdx.x; v < NT * 8 * kVecs; v += kThreads) {
    const int m = v / kVecs, c = (v % kVecs) * 8;
    const bool in = m < a.m && c0 + c < c_end;  // K % 8 == 0: a vector is all in or all out
    const uint16_t* src = in ? a.x + (int64_t)m * a.k + c0 + c : a.x;
    const uint32_t dst = (uint32_t)__cvta_generic_to_shared(xs + m * kXRow + c);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(in ? 16 : 0) : "memory");
  }
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int NT>
__global__ void __launch_bounds__(kThreads) skinny_kernel(const SkinnyArgs a, int slice_cols) {
  extern __shared__ __align__(16) uint16_t xs[];  // [2][NT * 8][kXRow]
  __shared__ int is_last;
  pdl_launch_dependents();  // the next kernel (if PDL) may start its own weight loads now

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int k_begin = blockIdx.y * slice_cols;
  const int k_end = min(a.k, k_begin + slice_cols);
  const int spans = (k_end - k_begin + kSpan - 1) / kSpan;
  const int row0 = blockIdx.x * kRowsPerCta + warp * 16;
  // Rows past N (the last CTA) read row N - 1 again and are never written.
  const uint16_t* w_lo = a.w + (int64_t)min(row0 + g, a.n - 1) * a.k;
  const uint16_t* w_hi = a.w + (int64_t)min(row0 + g + 8, a.n - 1) * a.k;

  uint4 ring[kDepth][8];  // [span % kDepth][row g: 0..3, row g + 8: 4..7]
  auto fetch = [&](int span, uint4 (&buf)[8]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int col = k_begin + span * kSpan + 32 * i + 8 * t;
      const bool in = span < spans && col < k_end;  // K % 8 == 0: a vector is all in or all out
      buf[i] = in ? __ldcs(reinterpret_cast<const uint4*>(w_lo + col)) : make_uint4(0u, 0u, 0u, 0u);
      buf[4 + i] = in ? __ldcs(reinterpret_cast<const uint4*>(w_hi + col)) : make_uint4(0u, 0u, 0u, 0u);
    }
  };
#pragma unroll
  for (int d = 0; d < kDepth; ++d) fetch(d, ring[d]);
  pdl_wait();  // x, the workspace and y belong to the previous kernel until now
  stage_x<NT>(a, k_begin, k_end, xs);

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[j][i] = 0.0f;

  for (int s = 0; s < spans; s += kDepth) {
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      const int span = s + d;
      if (span >= spans) break;  // uniform over the CTA
      const int stage = span / kSpansPerStage;
      const uint16_t* buf = xs + (stage % 2) * (NT * 8 * kXRow);
      if (span % kSpansPerStage == 0) {
        asm volatile("cp.async.wait_group 0;\n" ::: "memory");  // this thread's copies of `stage`
        __syncthreads();  // everyone's copies landed, and every warp is done with stage - 1
        if ((stage + 1) * kSpansPerStage < spans)
          stage_x<NT>(a, k_begin + (stage + 1) * kStageCols, k_end, xs + ((stage + 1) % 2) * (NT * 8 * kXRow));
      }
      uint4 cur[8];  // row g: 0..3, row g + 8: 4..7
#pragma unroll
      for (int i = 0; i < 8; ++i) cur[i] = ring[d][i];
      fetch(span + kDepth, ring[d]);  // in flight while `cur` is used
      const int col = (span % kSpansPerStage) * kSpan + 8 * t;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const uint16_t* xrow = buf + (8 * j + g) * kXRow + col;  // token 8j + g, the lane's columns
        uint4 xv[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) xv[i] = *reinterpret_cast<const uint4*>(xrow + 32 * i);
#pragma unroll
        for (int q = 0; q < 16; q += 2) {
          const uint32_t a[4] = {word(cur, q), word(cur + 4, q), word(cur, q + 1), word(cur + 4, q + 1)};
          sm90::mma_bf16(acc[j], a, word(xv, q), word(xv, q + 1));
        }
      }
    }
  }

  // C fragment: acc[j][0..1] = row g, tokens 8j + 2t, 8j + 2t + 1; acc[j][2..3] = row g + 8.
  const bool split = gridDim.y > 1;
  float* part = split ? a.partials + (int64_t)blockIdx.y * a.m * a.n : nullptr;
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int token = 8 * j + 2 * t + (i & 1), row = row0 + g + (i >= 2 ? 8 : 0);
      if (token >= a.m || row >= a.n) continue;
      if (split) part[(int64_t)token * a.n + row] = acc[j][i];
      else a.y[(int64_t)token * a.n + row] = fused::f32_to_bf16(acc[j][i]);
    }
  if (!split) return;

  __threadfence();  // this thread's partials are visible device-wide before the CTA is counted
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(a.counters + blockIdx.x, 1) == (int)gridDim.y - 1;
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  const int rows = min(kRowsPerCta, a.n - (int)blockIdx.x * kRowsPerCta);
  for (int idx = threadIdx.x; idx < rows * a.m; idx += kThreads) {
    const int64_t at = (int64_t)(idx / rows) * a.n + blockIdx.x * kRowsPerCta + idx % rows;
    float sum = __ldcg(a.partials + at);
    for (int s = 1; s < (int)gridDim.y; ++s) sum += __ldcg(a.partials + (int64_t)s * a.m * a.n + at);  // slice order
    a.y[at] = fused::f32_to_bf16(sum);
  }
  if (threadIdx.x == 0) a.counters[blockIdx.x] = 0;  // ready for the next launch
}

// Columns per slice for `splits` slices: whole spans.
int slice_cols(int k, int splits) {
  const int spans = (k + kSpan - 1) / kSpan;
  return (spans + splits - 1) / splits * kSpan;
}

}  // namespace

int skinny_counters(int n) { return (n + kRowsPerCta - 1) / kRowsPerCta; }

int64_t skinny_partials_floats(int splits, int m, int n) { return splits > 1 ? (int64_t)splits * m * n : 0; }

// Time model in spans per SM: ceil(CTAs / SMs) waves of (spans per slice + 3 for the first stage's
// latency and the reduction; fitted to a sweep on the H200, docs/PERF_NOTES.md); at least two CTAs
// per SM where the shape allows, then the fewest slices.
int skinny_splits(int n, int k) {
  const int spans = (k + kSpan - 1) / kSpan, blocks = skinny_counters(n), sms = split12::sm_count();
  int best = 1;
  int64_t best_time = INT64_MAX;
  bool best_fills = false;
  for (int s = 1; s <= spans && s <= 32; ++s) {
    const int per = (spans + s - 1) / s, slices = (spans + per - 1) / per;
    if (slices != s) continue;  // the same slicing as a smaller s
    const int64_t ctas = (int64_t)blocks * slices;
    const int64_t time = (ctas + sms - 1) / sms * (per + 3);
    const bool fills = ctas >= 2 * sms;
    if ((fills && !best_fills) || (fills == best_fills && time < best_time)) {
      best = s;
      best_time = time;
      best_fills = fills;
    }
  }
  return best;
}

int cuda_skinny_gemm(const SkinnyArgs& a, void* stream) {
  if (a.n < 1 || a.k < 8 || a.k % 8 != 0 || a.m < 1 || a.m > kMaxM) return (int)cudaErrorInvalidValue;
  const int splits_wanted = a.splits > 0 ? a.splits : skinny_splits(a.n, a.k);
  const int cols = slice_cols(a.k, splits_wanted);
  const int splits = (a.k + cols - 1) / cols;
  if (splits > 1 && (a.partials == nullptr || a.counters == nullptr)) return (int)cudaErrorInvalidValue;
  const dim3 grid(skinny_counters(a.n), splits);
  const int nt = a.m <= 8 ? 1 : 2;
  const int smem = 2 * nt * 8 * kXRow * 2;
  const auto s = static_cast<cudaStream_t>(stream);  // the kernel reads the slice count from gridDim.y
  if (nt == 1) return split12::launch_kernel(skinny_kernel<1>, grid, kThreads, smem, s, a.pdl, a, cols);
  return split12::launch_kernel(skinny_kernel<2>, grid, kThreads, smem, s, a.pdl, a, cols);
}

}  // namespace skinny
}  // namespace specpilot
