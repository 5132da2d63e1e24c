// The bf16 twin of the one-token split12 GEMV: bf16 weights in split12's reduction order, with
// gemv_m1's fused prologues (semantics in specpilot/gemv_m1.h, cuda_bf16_gemv_m1_twin). The split12
// GEMV itself (cuda_split12_gemv_m1) is the streamed kernel in split12_stream.cu, with the same
// bits; this pipeline ran split12 weights too until 2026-12-04 (H200, plain prologue, separate calls:
// qkv / o / gate_up / down / LM head 16.6 / 10.2 / 43.7 / 24.3 / 243 us here, 14.8 / 11.3 / 41.1 /
// 23.2 / 226 us streamed; docs/PERF_NOTES.md, thirteenth session).
//
// gemv_m1.cu's pipeline on split12_kernel.cuh's bf16 weight source:
// - a persistent grid of at most 2 CTAs per SM, 8 warps each; a warp takes kRows = 2 rows at a time
//   (two fmaf chains per lane, as split12_linear's fastest M = 1 kernel: each x value read from
//   shared memory feeds both), groups w, w + all warps, ...;
// - a lane loads one 32-column chunk of each of its rows per step (split12: 2 x 48 bytes) and
//   prefetches the next step, across row-group boundaries (with those rows' base and escape
//   range), before it decodes and adds the current one;
// - programmatic dependent launch: the first weight loads go out before griddepcontrol.wait;
// - every CTA computes the prologue into shared memory as fp32 (K * 4 bytes), swizzled so that the
//   8 lanes of a quarter-warp, which read 8 consecutive chunks, hit 8 different bank groups.
// Exactness: lane l adds chunks l, l + 32, ... ascending with one fmaf chain, then the butterfly:
// split12_format.h's order, so the output is bit-identical to split12_linear / bf16_linear (CPU and
// CUDA) on the prologue's output, and to the split12 GEMV on the same weights. K % 32 == 0 only
// (no tail chunk); the launcher refuses other K.
#include <cuda_runtime.h>

#include "gemv_prologue.cuh"
#include "specpilot/gemv_m1.h"
#include "split12_kernel.cuh"
#include "split12_launch.h"

namespace specpilot {
namespace split12 {
namespace {

using gemv::GemvArgs;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kCtasPerSm = 2;
constexpr int kRows = 2;  // rows per warp: two fmaf chains per lane, each x load feeds both

// x's float4 v (chunk v / 8, columns 4 (v % 8) ..) lives at v ^ (chunk % 8): lane l reads chunk
// l + 32j, so a quarter-warp's 8 lanes read 8 consecutive chunks at 8 different 16-byte bank groups.
__device__ __forceinline__ int swizzled(int v) { return v ^ ((v >> 3) & 7); }

// acc[r] += W_r[chunk c] . x[chunk c] for each row r, columns ascending (word i of w[r]: columns
// 2i (low half), 2i + 1 (high half)).
__device__ __forceinline__ void dot_chunk(const uint32_t (&w)[kRows][16], const float4* xs, int c,
                                          float (&acc)[kRows]) {
#pragma unroll
  for (int q = 0; q < 8; ++q) {
    const float4 xv = xs[swizzled(8 * c + q)];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      acc[r] = __fmaf_rn(xv.x, lo_half_to_float(w[r][2 * q]), acc[r]);
      acc[r] = __fmaf_rn(xv.y, hi_half_to_float(w[r][2 * q]), acc[r]);
      acc[r] = __fmaf_rn(xv.z, lo_half_to_float(w[r][2 * q + 1]), acc[r]);
      acc[r] = __fmaf_rn(xv.w, hi_half_to_float(w[r][2 * q + 1]), acc[r]);
    }
  }
}

template <int P, class Source>
__global__ void __launch_bounds__(kThreads, kCtasPerSm) gemv_m1_kernel(const Source src, const GemvArgs a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ float scratch[33];
  float4* xs = reinterpret_cast<float4*>(smem_raw);
  pdl_launch_dependents();  // the next kernel (if PDL) may start its own weight loads now

  using Row = typename Source::Row;
  using Raw = typename Source::Raw;
  const int lane = threadIdx.x % 32;
  const int nchunks = a.k / kChunk;
  const int lane_chunks = (nchunks + kLanes - 1) / kLanes;  // steps per row group: chunk lane + 32 j
  const int group_stride = gridDim.x * kWarps * kRows;
  // Rows past N are computed on row N - 1 and not stored (every lane stays in the butterfly).
  auto clamp_row = [&](int n) { return n < a.n ? n : a.n - 1; };

  // A warp's work: row groups (kRows rows) in the grid's order, each in steps j = 0, 1, ... (chunk
  // lane + 32 j of each row); `next` holds step (next_group, next_j), loaded one step ahead.
  int group = (blockIdx.x * kWarps + threadIdx.x / 32) * kRows, j = 0;
  Row ahead[kRows];  // next_group's planes, base and escape range
  Raw next[kRows];
  auto fetch = [&](int step) {  // step `step` of the rows in `ahead`
    const int c = lane + kLanes * step;
    if (c >= nchunks) return;
#pragma unroll
    for (int r = 0; r < kRows; ++r) src.fetch(ahead[r], c, true, next[r]);
  };
  auto start_group = [&](int g) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) ahead[r] = src.row_planes(clamp_row(g + r));
    fetch(0);
#pragma unroll
    for (int r = 0; r < kRows; ++r) src.row_bounds(ahead[r], clamp_row(g + r));
  };
  if (group < a.n) start_group(group);

  pdl_wait();  // x, delta and the outputs belong to the previous kernel until now
  gemv::prologue<P>(a, a.k / 8, scratch, [xs](int v, const uint4& b) {  // 8 bf16 -> 2 float4
    xs[swizzled(2 * v)] = make_float4(lo_half_to_float(b.x), hi_half_to_float(b.x), lo_half_to_float(b.y),
                                      hi_half_to_float(b.y));
    xs[swizzled(2 * v + 1)] = make_float4(lo_half_to_float(b.z), hi_half_to_float(b.z), lo_half_to_float(b.w),
                                          hi_half_to_float(b.w));
  });
  __syncthreads();

  Row rows[kRows];  // the current group's escape cursors
  float acc[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) acc[r] = 0.0f;
  while (group < a.n) {
    Raw cur[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) cur[r] = next[r];
    if (j == 0) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        rows[r] = ahead[r];
        src.escape_cursor(rows[r]);
      }
    }
    const bool last_step = j + 1 == lane_chunks;
    const int next_group = last_step ? group + group_stride : group;
    if (next_group < a.n) {  // in flight while `cur` is decoded
      if (last_step) {
        start_group(next_group);
      } else {
        fetch(j + 1);
      }
    }
    const int c = lane + kLanes * j;
    if (c < nchunks) {
      uint32_t w[kRows][16];
#pragma unroll
      for (int r = 0; r < kRows; ++r) src.decode(rows[r], c, true, a.k, cur[r], w[r]);
      dot_chunk(w, xs, c, acc);
    }
    if (last_step) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
#pragma unroll
        for (int off = kLanes / 2; off >= 1; off /= 2) acc[r] = acc[r] + __shfl_xor_sync(0xFFFFFFFFu, acc[r], off);
        if (lane == r && group + r < a.n) a.y[group + r] = f32_bits_to_bf16_rne(__float_as_uint(acc[r]));
        acc[r] = 0.0f;
      }
      j = 0;
      group = next_group;
    } else {
      ++j;
    }
  }
}

template <int P, class Source>
int launch_with(const Source& src, const GemvArgs& a, cudaStream_t stream) {
  auto kernel = gemv_m1_kernel<P, Source>;
  const size_t smem = (size_t)a.k * sizeof(float);
  static bool opted_in = false;  // > 48 KB of dynamic shared memory needs the opt-in (K > 12288)
  if (!opted_in) {
    const int err = (int)cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              (int)(gemv::kMaxK * sizeof(float)));
    if (err != 0) return err;
    opted_in = true;
  }
  int grid = (a.n + kWarps * kRows - 1) / (kWarps * kRows);
  grid = grid < kCtasPerSm * sm_count() ? grid : kCtasPerSm * sm_count();
  return launch_kernel(kernel, grid, kThreads, (int)smem, stream, a.pdl, src, a);
}

template <class Source>
int launch(const Source& src, const GemvArgs& a, void* stream) {
  if (!gemv::split12_order_args_ok(a)) return (int)cudaErrorInvalidValue;
  const auto s = static_cast<cudaStream_t>(stream);
  switch (a.prologue) {
    case gemv::kGemvAddNorm: return launch_with<gemv::kGemvAddNorm>(src, a, s);
    case gemv::kGemvSiluMul: return launch_with<gemv::kGemvSiluMul>(src, a, s);
    default: return launch_with<gemv::kGemvPlain>(src, a, s);
  }
}

}  // namespace
}  // namespace split12

namespace gemv {

int cuda_bf16_gemv_m1_twin(const GemvArgs& a, void* stream) {
  if ((reinterpret_cast<uintptr_t>(a.w) & 15u) != 0) return (int)cudaErrorInvalidValue;
  const split12::Bf16Source src{a.w, a.k, true};
  return split12::launch(src, a, stream);
}

}  // namespace gemv
}  // namespace specpilot
