// What both skinny GEMMs share (skinny_gemm.cu reads bf16 weights, split12_skinny.cu decodes
// split12 ones): the tile geometry, the cut of the step list over persistent CTAs, the MMA
// warpgroup's wgmmas per stage and its segment flush, and the TMA tensor maps. The same tiles,
// cuts and wgmma order are what make the split12 kernel bit-identical to the bf16 one on the
// unpacked weights. Design and measurements: skinny_gemm.cu.
#pragma once

#include <cuda.h>  // CUtensorMap
#include <cuda_runtime.h>

#include "fused_bf16.cuh"  // f32_to_bf16
#include "sm90_device.cuh"
#include "specpilot/skinny_gemm.h"

namespace specpilot {
namespace skinny {
namespace {

constexpr int kBoxes = 4;         // TMA boxes of kBlockK columns per K step
constexpr int kStepK = kBlockK * kBoxes;
constexpr int kConsumers = 128;  // the MMA warpgroup: threads 0..127
constexpr int kWTileBytes = kRowsPerCta * kBlockK * 2;  // one box of bf16 weights
constexpr int kXTileBytes = kMaxM * kBlockK * 2;

struct Plan {
  uint16_t* y;
  float* partials;
  int* counters;
  int n, m;
  int k_steps;      // K steps per row block
  int64_t steps;    // row blocks * k_steps
};

using sm90::fence_register;

// First step of CTA c's range, and the CTA whose range holds step s (inverse of the cut).
__device__ __forceinline__ int64_t range_start(int64_t c, int64_t steps, int ctas) { return c * steps / ctas; }
__device__ __forceinline__ int owner(int64_t s, int64_t steps, int ctas) { return (int)(((s + 1) * ctas - 1) / steps); }

__device__ __forceinline__ void consumer_barrier() { sm90::named_barrier_sync<1, kConsumers>(); }

// Accumulator element i of this thread (wgmma m64n16 layout): tile row (weight row in the block), token.
__device__ __forceinline__ int acc_row(int i) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  return 16 * warp + lane / 4 + ((i & 2) ? 8 : 0);
}
__device__ __forceinline__ int acc_token(int i) { return 8 * (i / 4) + 2 * (threadIdx.x % 4) + (i & 1); }

// The segment of `block` just finished by this CTA: straight to y if the CTA covered the whole
// block, else through the partials (the last segment to arrive sums all of them in K order).
__device__ void flush(const Plan& a, int block, float (&acc)[8], int* is_last) {
  const int ctas = gridDim.x;
  const int first = owner((int64_t)block * a.k_steps, a.steps, ctas);
  const int last = owner((int64_t)(block + 1) * a.k_steps - 1, a.steps, ctas);
  const int row0 = block * kRowsPerCta;
  if (first == last) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int row = row0 + acc_row(i), token = acc_token(i);
      if (row < a.n && token < a.m) a.y[(int64_t)token * a.n + row] = fused::f32_to_bf16(acc[i]);
    }
    return;
  }
  constexpr int kSlot = kRowsPerCta * kMaxM;
  float* mine = a.partials + (int64_t)(blockIdx.x + block) * kSlot;  // segment ids: CTA + block
#pragma unroll
  for (int i = 0; i < 8; ++i) __stcg(mine + acc_row(i) * kMaxM + acc_token(i), acc[i]);
  __threadfence();  // this thread's partials are visible device-wide before the segment is counted
  consumer_barrier();
  if (threadIdx.x == 0) *is_last = atomicAdd(a.counters + block, 1) == last - first;
  consumer_barrier();
  if (!*is_last) return;
  __threadfence();
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int row = row0 + acc_row(i), token = acc_token(i), at = acc_row(i) * kMaxM + token;
    float sum = __ldcg(a.partials + (int64_t)(first + block) * kSlot + at);
    for (int c = first + 1; c <= last; ++c) sum += __ldcg(a.partials + (int64_t)(c + block) * kSlot + at);
    if (row < a.n && token < a.m) a.y[(int64_t)token * a.n + row] = fused::f32_to_bf16(sum);
  }
  if (threadIdx.x == 0) a.counters[block] = 0;  // ready for the next launch
}

// The MMA warpgroup's work on one stage: kBoxes x 4 wgmmas of the weight tiles at `w_tiles` and
// the x tiles at `x_tiles` (kWTileBytes / kXTileBytes apart), complete when it returns.
__device__ __forceinline__ void mma_stage(float (&acc)[8], uint32_t w_tiles, uint32_t x_tiles) {
#pragma unroll
  for (int j = 0; j < 8; ++j) fence_register(acc[j]);
  sm90::wgmma_fence();
#pragma unroll
  for (int b = 0; b < kBoxes; ++b)
#pragma unroll
    for (int kk = 0; kk < kBlockK / 16; ++kk)
      sm90::wgmma_m64n16k16_bf16(acc, sm90::wgmma_desc_sw128(w_tiles + b * kWTileBytes + 32 * kk),
                                 sm90::wgmma_desc_sw128(x_tiles + b * kXTileBytes + 32 * kk));
  sm90::wgmma_commit();
  sm90::wgmma_wait_all();
#pragma unroll
  for (int j = 0; j < 8; ++j) fence_register(acc[j]);
}

// x's boxes for step s (kBoxes boxes of kBlockK columns, kXTileBytes apart from `dst`).
__device__ __forceinline__ void load_x_step(uint32_t dst, const CUtensorMap* x_map, int64_t s, int k_steps,
                                            uint32_t bar) {
  for (int b = 0; b < kBoxes; ++b)
    sm90::tma_load_2d(dst + b * kXTileBytes, x_map, (int)(s % k_steps) * kStepK + b * kBlockK, 0, bar);
}

// The producer thread's loop over this CTA's `count` steps: wait until step i's stage is free
// (`empty`), then `load_weights(i)` (arrive_expect_tx and the weight copies) and `load_x(i)`. The
// weight copies of the first stages go out before griddepcontrol.wait: weights are never written
// by the previous kernel; x is.
template <int stages, class LoadWeights, class LoadX, class Empty>
__device__ __forceinline__ void producer_role(int count, LoadWeights load_weights, LoadX load_x, Empty empty) {
  const int ahead = min(stages, count);
  for (int i = 0; i < ahead; ++i) load_weights(i);
  sm90::pdl_wait();
  for (int i = 0; i < ahead; ++i) load_x(i);
  for (int i = ahead; i < count; ++i) {
    sm90::mbar_wait(empty(i % stages), (i / stages - 1) & 1);
    load_weights(i);
    load_x(i);
  }
}

// The MMA warpgroup's loop over this CTA's steps first .. first + count - 1: wait for step i's
// bf16 tiles (`ready`; weights at the stage's start, x `x_offset` further), run the wgmmas, release
// the stage (`empty`), flush every segment that ends.
template <int stages, class Ready, class Empty>
__device__ __forceinline__ void mma_role(const Plan& a, int64_t first, int count, uint32_t base, int stage_bytes,
                                         int x_offset, Ready ready, Empty empty, int* is_last) {
  sm90::pdl_wait();  // y, the partials and the counters belong to the previous kernel until now
  float acc[8] = {};  // this thread's part of the 64 x 16 tile (acc_row, acc_token)
  for (int i = 0; i < count; ++i) {
    const int64_t s = first + i;
    const int stage = i % stages;
    sm90::mbar_wait(ready(stage), (i / stages) & 1);
    const uint32_t tiles = base + stage * stage_bytes;
    mma_stage(acc, tiles, tiles + x_offset);
    sm90::mbar_arrive(empty(stage));
    if (s % a.k_steps == a.k_steps - 1 || i == count - 1) {  // the end of a segment
      flush(a, (int)(s / a.k_steps), acc, is_last);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[j] = 0.0f;
    }
  }
}

// cuTensorMapEncodeTiled from the driver, looked up once (no link-time dependency on libcuda).
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiled encode_tiled() {
  static const EncodeTiled fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      return static_cast<EncodeTiled>(nullptr);
    return reinterpret_cast<EncodeTiled>(p);
  }();
  return fn;
}

// A [rows, cols] row-major matrix of `type` (bf16 or uint8) read in boxes of box_rows x box_cols;
// boxes past the edges are zero-filled. bf16 boxes are one 128-byte swizzle row wide (what wgmma
// reads); uint8 boxes (split12 planes) are stored plain.
bool tile_map(CUtensorMap* map, const void* ptr, CUtensorMapDataType type, int rows, int64_t cols, int box_cols,
              int box_rows) {
  const EncodeTiled encode = encode_tiled();
  if (encode == nullptr) return false;
  const bool bf16 = type == CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
  const cuuint64_t strides[1] = {(cuuint64_t)cols * (bf16 ? 2 : 1)};
  const cuuint32_t box[2] = {(cuuint32_t)box_cols, (cuuint32_t)box_rows};
  const cuuint32_t element_strides[2] = {1, 1};
  return encode(map, type, 2, const_cast<void*>(ptr), dims, strides, box, element_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, bf16 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Steps (a row block's kStepK columns) of an N x K weight: the list the CTAs cut.
inline int64_t total_steps(int n, int k) { return (int64_t)skinny_counters(n) * ((k + kStepK - 1) / kStepK); }

}  // namespace
}  // namespace skinny
}  // namespace specpilot
