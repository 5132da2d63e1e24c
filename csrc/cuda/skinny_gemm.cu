// Skinny bf16 GEMM on Hopper tensor cores (M <= 16): semantics in specpilot/skinny_gemm.h.
//
// Swap-AB: the weight is the wgmma's A side (m64: 64 weight rows per tile), the token rows its N
// side (n16, rows past M zero). Both operands are K-major tiles of 64 columns (128 bytes per row)
// that TMA copies into shared memory in the 128-byte swizzle wgmma reads, so no register holds a
// weight: the bytes in flight are bounded by the shared-memory ring, not by registers (the limit
// of the earlier register-ring mma.sync kernel, which lost to cuBLAS at 16 rows: PERF_NOTES,
// sixth session). A stage is kBoxes boxes side by side in K (512 contiguous bytes per weight row):
// with one box per stage (128 bytes per row) the ring streamed ~20% slower, even holding more bytes
// in flight (PERF_NOTES, seventh session).
//
// Work split: the N / 64 row blocks times K / 256 steps form one list of steps, cut into equal
// contiguous ranges, one per persistent CTA (balanced to one step whatever the shape). A CTA's
// range covers pieces ("segments") of one or more row blocks; a block that one CTA covers whole is
// written straight to y, else each segment's fp32 sums go to `partials` and the last CTA to finish
// one (an atomic counter per block, reset by that CTA) adds them in K order: deterministic. That
// round trip costs ~2 us, so skinny_ctas prefers grids whose cuts fall on row-block boundaries.
//
// Roles: warps 0-3 (one warpgroup) wait for a stage, run its wgmmas, release it; warp 4's lane 0
// issues the TMA copies kStages steps ahead. With PDL the weight copies of the first stages start
// before griddepcontrol.wait (weights are never written by the previous kernel; x is).
#include <cuda.h>  // CUtensorMap
#include <cuda_runtime.h>

#include "fused_bf16.cuh"  // f32_to_bf16
#include "sm90_device.cuh"
#include "specpilot/skinny_gemm.h"
#include "split12_launch.h"  // sm_count, launch_kernel

namespace specpilot {
namespace skinny {
namespace {

constexpr int kStages = 3;
constexpr int kBoxes = 4;          // TMA boxes of kBlockK columns per stage
constexpr int kStepK = kBlockK * kBoxes;
constexpr int kConsumers = 128;  // one warpgroup
constexpr int kThreads = kConsumers + 32;
constexpr int kWTileBytes = kRowsPerCta * kBlockK * 2;
constexpr int kXTileBytes = kMaxM * kBlockK * 2;
constexpr int kStageBytes = kBoxes * (kWTileBytes + kXTileBytes);  // multiple of 1024: tiles stay aligned
constexpr int kSmemBytes = kStages * kStageBytes + 2 * kStages * 8 + 1024;  // + mbarriers, alignment slack

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

__global__ void __launch_bounds__(kThreads) skinny_kernel(const __grid_constant__ CUtensorMap w_map,
                                                          const __grid_constant__ CUtensorMap x_map, const Plan a) {
  extern __shared__ uint8_t smem_raw[];
  __shared__ int is_last;
  const uint32_t base = (sm90::smem_u32(smem_raw) + 1023) & ~1023u;  // swizzled tiles: 1024-byte aligned
  const uint32_t bars = base + kStages * kStageBytes;
  auto full = [&](int stage) { return bars + 8 * stage; };                // TMA bytes landed
  auto empty = [&](int stage) { return bars + 8 * (kStages + stage); };   // consumers done with it
  sm90::pdl_launch_dependents();  // the next kernel (if PDL) may start its own weight loads now

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      sm90::mbar_init(full(s), 1);
      sm90::mbar_init(empty(s), kConsumers);
    }
    sm90::mbar_init_fence();
  }
  __syncthreads();

  const int64_t first = range_start(blockIdx.x, a.steps, gridDim.x);
  const int count = (int)(range_start(blockIdx.x + 1, a.steps, gridDim.x) - first);

  if (threadIdx.x >= kConsumers) {  // producer: one thread issues every copy
    if (threadIdx.x != kConsumers) return;
    auto load_w = [&](int i) {
      const int64_t s = first + i;
      const int stage = i % kStages;
      sm90::mbar_arrive_expect_tx(full(stage), kStageBytes);
      for (int b = 0; b < kBoxes; ++b) {
        const uint32_t dst = base + stage * kStageBytes + b * kWTileBytes;
        const int col = (int)(s % a.k_steps) * kStepK + b * kBlockK, row = (int)(s / a.k_steps) * kRowsPerCta;
        sm90::tma_load_2d_evict_first(dst, &w_map, col, row, full(stage));  // weights are read once
      }
    };
    auto load_x = [&](int i) {
      const int64_t s = first + i;
      const int stage = i % kStages;
      for (int b = 0; b < kBoxes; ++b)
        sm90::tma_load_2d(base + stage * kStageBytes + kBoxes * kWTileBytes + b * kXTileBytes, &x_map,
                          (int)(s % a.k_steps) * kStepK + b * kBlockK, 0, full(stage));
    };
    const int ahead = min(kStages, count);
    for (int i = 0; i < ahead; ++i) load_w(i);
    sm90::pdl_wait();  // x belongs to the previous kernel until now
    for (int i = 0; i < ahead; ++i) load_x(i);
    for (int i = ahead; i < count; ++i) {
      sm90::mbar_wait(empty(i % kStages), (i / kStages - 1) & 1);
      load_w(i);
      load_x(i);
    }
    return;
  }

  sm90::pdl_wait();  // y, the partials and the counters belong to the previous kernel until now
  float acc[8] = {};  // this thread's part of the 64 x 16 tile (acc_row, acc_token)
  for (int i = 0; i < count; ++i) {
    const int64_t s = first + i;
    const int stage = i % kStages;
    sm90::mbar_wait(full(stage), (i / kStages) & 1);
    const uint32_t w_tiles = base + stage * kStageBytes, x_tiles = w_tiles + kBoxes * kWTileBytes;
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
    sm90::mbar_arrive(empty(stage));
    if (s % a.k_steps == a.k_steps - 1 || i == count - 1) {  // the end of a segment
      flush(a, (int)(s / a.k_steps), acc, &is_last);
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

// A [rows, cols] bf16 row-major matrix read in boxes of box_rows x kBlockK, 128-byte swizzled;
// boxes past the edges are zero-filled.
bool tile_map(CUtensorMap* map, const uint16_t* ptr, int rows, int cols, int box_rows) {
  const EncodeTiled encode = encode_tiled();
  if (encode == nullptr) return false;
  const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
  const cuuint64_t strides[1] = {(cuuint64_t)cols * 2};
  const cuuint32_t box[2] = {kBlockK, (cuuint32_t)box_rows};
  const cuuint32_t element_strides[2] = {1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<uint16_t*>(ptr), dims, strides, box,
                element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// The kernel's dynamic shared memory is above the 48 KB default: raise its limit once.
int allow_smem() {
  static const int err = (int)cudaFuncSetAttribute(skinny_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   kSmemBytes);
  return err;
}

int64_t total_steps(int n, int k) {
  return (int64_t)skinny_counters(n) * ((k + kStepK - 1) / kStepK);
}

}  // namespace

int skinny_counters(int n) { return (n + kRowsPerCta - 1) / kRowsPerCta; }

int64_t skinny_partials_floats(int ctas, int n) { return (int64_t)(ctas + skinny_counters(n)) * kRowsPerCta * kMaxM; }

// The grid, at most one CTA per SM (two per SM measured slower: more rows streamed at once). A
// CTA covering whole row blocks writes y directly; a split block costs the partials round trip
// (~2 us); fewer CTAs stream less in total. Measured on the H200 (PERF_NOTES, seventh session), in
// order of preference: whole row blocks per CTA on at least half the SMs, or on a quarter when each
// CTA streams at most 1 MB; else each row block cut into equal K pieces on at least half the SMs;
// else one CTA per SM with the cuts anywhere.
int skinny_ctas(int n, int k) {
  const int64_t steps = total_steps(n, k);
  const int blocks = skinny_counters(n), k_steps = (int)(steps / blocks), sms = split12::sm_count();
  int whole = 0, cut = 0;
  for (int j = 1; j <= blocks && whole == 0; ++j)
    if (blocks % j == 0 && blocks / j <= sms) whole = blocks / j;
  for (int j = 2; j <= k_steps && (int64_t)blocks * j <= sms; ++j)
    if (k_steps % j == 0) cut = blocks * j;
  const int64_t bytes_per_cta = (int64_t)n * k * 2 / std::max(whole, 1);
  if (2 * whole >= sms || (4 * whole >= sms && bytes_per_cta <= (1 << 20))) return whole;
  if (2 * cut >= sms) return cut;
  return (int)std::min<int64_t>(steps, sms);
}

int cuda_skinny_gemm(const SkinnyArgs& a, void* stream) {
  if (a.n < 1 || a.k < 8 || a.k % 8 != 0 || a.m < 1 || a.m > kMaxM) return (int)cudaErrorInvalidValue;
  const int64_t steps = total_steps(a.n, a.k);
  const int ctas = a.ctas > 0 ? (int)std::min<int64_t>(a.ctas, steps) : skinny_ctas(a.n, a.k);
  if (a.partials == nullptr || a.counters == nullptr) return (int)cudaErrorInvalidValue;
  CUtensorMap w_map, x_map;
  if (!tile_map(&w_map, a.w, a.n, a.k, kRowsPerCta) || !tile_map(&x_map, a.x, a.m, a.k, kMaxM))
    return (int)cudaErrorInvalidValue;
  if (const int err = allow_smem()) return err;
  Plan plan{a.y, a.partials, a.counters, a.n, a.m, (a.k + kStepK - 1) / kStepK, steps};
  return split12::launch_kernel(skinny_kernel, dim3(ctas), kThreads, kSmemBytes, static_cast<cudaStream_t>(stream),
                                a.pdl, w_map, x_map, plan);
}

}  // namespace skinny
}  // namespace specpilot
