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
#include "skinny_common.cuh"
#include "split12_launch.h"  // sm_count, launch_kernel

namespace specpilot {
namespace skinny {
namespace {

constexpr int kStages = 3;
constexpr int kThreads = kConsumers + 32;  // + the producer warp
constexpr int kStageBytes = kBoxes * (kWTileBytes + kXTileBytes);  // multiple of 1024: tiles stay aligned
constexpr int kSmemBytes = kStages * kStageBytes + 2 * kStages * 8 + 1024;  // + mbarriers, alignment slack

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
      load_x_step(base + (i % kStages) * kStageBytes + kBoxes * kWTileBytes, &x_map, first + i, a.k_steps,
                  full(i % kStages));
    };
    producer_role<kStages>(count, load_w, load_x, empty);
    return;
  }
  mma_role<kStages>(a, first, count, base, kStageBytes, kBoxes * kWTileBytes, full, empty, &is_last);
}

// The kernel's dynamic shared memory is above the 48 KB default: raise its limit once.
int allow_smem() {
  static const int err = (int)cudaFuncSetAttribute(skinny_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   kSmemBytes);
  return err;
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
  if (!tile_map(&w_map, a.w, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, a.n, a.k, kBlockK, kRowsPerCta) ||
      !tile_map(&x_map, a.x, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, a.m, a.k, kBlockK, kMaxM))
    return (int)cudaErrorInvalidValue;
  if (const int err = allow_smem()) return err;
  Plan plan{a.y, a.partials, a.counters, a.n, a.m, (a.k + kStepK - 1) / kStepK, steps};
  return split12::launch_kernel(skinny_kernel, dim3(ctas), kThreads, kSmemBytes, static_cast<cudaStream_t>(stream),
                                a.pdl, w_map, x_map, plan);
}

}  // namespace skinny
}  // namespace specpilot
