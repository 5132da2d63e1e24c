// The skinny GEMM (M <= 16) for split12 weights: semantics in specpilot/skinny_gemm.h.
//
// The bf16 kernel (skinny_gemm.cu) with a decode stage in the ring. TMA brings a step's `lo` plane
// (64 rows x 256 bytes) and `codes` plane (64 x 128 bytes) as plain uint8 boxes, 24 KB instead of
// the 32 KB of bf16, with x as before. A decoder warpgroup turns them into the four 128-byte
// swizzled bf16 boxes that TMA would have written for the unpacked weights (zeros past N and K,
// escapes substituted from the row's list), and the MMA warpgroup runs the very wgmmas and
// segment flush of the bf16 kernel on them (skinny_common.cuh): the output is bit-identical to
// skinny_gemm on the unpacked weights with the same grid.
//
// Stage (64 KB, 3 stages, one CTA per SM): decoded weights 32 KB | x 8 KB | lo 16 KB | codes 8 KB.
// Barriers per stage: full (TMA bytes), decoded (128 decoder arrivals), empty (128 MMA arrivals;
// the decoder finished with the raw planes before the MMA could start).
// Roles: threads 0-127 MMA (the warpgroup skinny_common's flush expects), 128-255 decoder, 256 the
// producer. Decoder thread d owns row d / 2 of the block and half d % 2 of the step's 256 columns.
//
// Status: checked on the host (tests/test_skinny_gemm_emulation.py: bit-identical to the bf16
// kernel there); not yet run or timed on a GPU.
#include "skinny_common.cuh"
#include "split12_launch.h"  // sm_count, launch_kernel

namespace specpilot {
namespace skinny {
namespace {

constexpr int kStages = 3;
constexpr int kDecoders = 128;
constexpr int kThreads = kConsumers + kDecoders + 32;
constexpr int kLoBytes = kRowsPerCta * kStepK;        // one byte per weight
constexpr int kCodesBytes = kRowsPerCta * kStepK / 2;  // one nibble per weight
constexpr int kXOffset = kBoxes * kWTileBytes;
constexpr int kLoOffset = kXOffset + kBoxes * kXTileBytes;
constexpr int kCodesOffset = kLoOffset + kLoBytes;
constexpr int kStageBytes = kCodesOffset + kCodesBytes;  // multiple of 1024: tiles stay aligned
constexpr int kTmaBytes = kLoBytes + kCodesBytes + kBoxes * kXTileBytes;
constexpr int kSmemBytes = kStages * kStageBytes + 3 * kStages * 8 + 1024;  // + mbarriers, alignment slack
constexpr int kHalf = kStepK / 2;  // columns per decoder thread and step

struct Split12Plan {
  Plan plan;
  const uint8_t* base;
  const int32_t* esc_rowptr;
  const int32_t* esc_col;
  const uint16_t* esc_val;
  int k;
};

// 8 weights of one row: their code word (byte j holds columns j (low nibble) and j + 4 (high)) and
// low bytes -> bf16 bits, hi = sign << 7 | (cls + base) (split12_format.h).
__device__ __forceinline__ uint4 decode8(uint32_t codes, uint2 lo, uint32_t base) {
  uint32_t bits[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const uint32_t nibble = (codes >> (8 * (j % 4) + 4 * (j / 4))) & 0xFu;
    const uint32_t low = ((j < 4 ? lo.x : lo.y) >> (8 * (j % 4))) & 0xFFu;
    bits[j] = ((nibble >> 3) << 15) | (((nibble & 7u) + base) << 8) | low;
  }
  return make_uint4(bits[0] | bits[1] << 16, bits[2] | bits[3] << 16, bits[4] | bits[5] << 16, bits[6] | bits[7] << 16);
}

// Element j (0..7, known only at run time) of 8 bf16 in a uint4 set to `bits`, without indexing
// the vector dynamically (that would put it in local memory).
__device__ __forceinline__ void set_bf16(uint4& v, int j, uint16_t bits) {
  uint32_t w = j < 2 ? v.x : j < 4 ? v.y : j < 6 ? v.z : v.w;
  w = j % 2 ? (w & 0x0000FFFFu) | ((uint32_t)bits << 16) : (w & 0xFFFF0000u) | bits;
  if (j < 2) v.x = w;
  else if (j < 4) v.y = w;
  else if (j < 6) v.z = w;
  else v.w = w;
}

// One decoder thread's part of a stage: row `r` of the tile, columns [col0, col0 + kHalf) of the
// matrix, from the raw planes at `lo` / `codes` into the swizzled boxes at `tiles`. `esc` / `esc_end`:
// the row's escape cursor, kept across the steps of a segment (columns only grow).
__device__ __forceinline__ void decode_half(const Split12Plan& a, int row, int r, int col0, const uint8_t* lo,
                                            const uint8_t* codes, uint8_t* tiles, uint32_t base, int& esc,
                                            int esc_end) {
  while (esc < esc_end && a.esc_col[esc] < col0) ++esc;  // escapes of the other half or earlier steps
  int next = esc < esc_end ? a.esc_col[esc] : INT32_MAX;
#pragma unroll 4
  for (int g = 0; g < kHalf / 8; ++g) {
    const int col = col0 + 8 * g;  // K % 8 == 0: a group is all inside K or all outside
    uint4 out = make_uint4(0u, 0u, 0u, 0u);
    if (row < a.plan.n && col < a.k) {
      out = decode8(*reinterpret_cast<const uint32_t*>(codes + 4 * g), *reinterpret_cast<const uint2*>(lo + 8 * g),
                    base);
      while (next < col + 8) {  // escapes are rare: a branch per group
        set_bf16(out, next - col, a.esc_val[esc]);
        ++esc;
        next = esc < esc_end ? a.esc_col[esc] : INT32_MAX;
      }
    }
    const int kl = col % kStepK;  // column within the step
    *reinterpret_cast<uint4*>(tiles + (kl / kBlockK) * kWTileBytes + r * 128 + (((kl % kBlockK) / 8) ^ (r % 8)) * 16) =
        out;
  }
}

__global__ void __launch_bounds__(kThreads) split12_skinny_kernel(const __grid_constant__ CUtensorMap lo_map,
                                                                  const __grid_constant__ CUtensorMap codes_map,
                                                                  const __grid_constant__ CUtensorMap x_map,
                                                                  const Split12Plan a) {
  extern __shared__ uint8_t smem_raw[];
  __shared__ int is_last;
  const uint32_t base = (sm90::smem_u32(smem_raw) + 1023) & ~1023u;  // swizzled tiles: 1024-byte aligned
  uint8_t* const smem = smem_raw + (base - sm90::smem_u32(smem_raw));
  const uint32_t bars = base + kStages * kStageBytes;
  auto full = [&](int stage) { return bars + 8 * stage; };                    // TMA bytes landed
  auto decoded = [&](int stage) { return bars + 8 * (kStages + stage); };     // bf16 tiles written
  auto empty = [&](int stage) { return bars + 8 * (2 * kStages + stage); };   // MMA done with them
  sm90::pdl_launch_dependents();  // the next kernel (if PDL) may start its own weight loads now

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      sm90::mbar_init(full(s), 1);
      sm90::mbar_init(decoded(s), kDecoders);
      sm90::mbar_init(empty(s), kConsumers);
    }
    sm90::mbar_init_fence();
  }
  __syncthreads();

  const Plan& p = a.plan;
  const int64_t first = range_start(blockIdx.x, p.steps, gridDim.x);
  const int count = (int)(range_start(blockIdx.x + 1, p.steps, gridDim.x) - first);

  if (threadIdx.x >= kConsumers + kDecoders) {  // producer: one thread issues every copy
    if (threadIdx.x != kConsumers + kDecoders) return;
    auto load_planes = [&](int i) {
      const int64_t s = first + i;
      const int stage = i % kStages;
      const uint32_t at = base + stage * kStageBytes;
      const int step = (int)(s % p.k_steps), row = (int)(s / p.k_steps) * kRowsPerCta;
      sm90::mbar_arrive_expect_tx(full(stage), kTmaBytes);
      sm90::tma_load_2d_evict_first(at + kLoOffset, &lo_map, step * kStepK, row, full(stage));
      sm90::tma_load_2d_evict_first(at + kCodesOffset, &codes_map, step * kStepK / 2, row, full(stage));
    };
    auto load_x = [&](int i) {
      load_x_step(base + (i % kStages) * kStageBytes + kXOffset, &x_map, first + i, p.k_steps, full(i % kStages));
    };
    producer_role<kStages>(count, load_planes, load_x, empty);
    return;
  }

  if (threadIdx.x >= kConsumers) {  // decoder: the planes never change, so no PDL wait
    const int d = threadIdx.x - kConsumers, r = d / 2, half = d % 2;
    int block = -1, row = 0, esc = 0, esc_end = 0;
    uint32_t row_base = 0;
    for (int i = 0; i < count; ++i) {
      const int64_t s = first + i;
      const int stage = i % kStages;
      if ((int)(s / p.k_steps) != block) {  // a new segment: this thread's row and its escapes
        block = (int)(s / p.k_steps);
        row = block * kRowsPerCta + r;
        const bool in = row < p.n;
        row_base = in ? a.base[row] : 0u;
        esc = in ? a.esc_rowptr[row] : 0;
        esc_end = in ? a.esc_rowptr[row + 1] : 0;
      }
      sm90::mbar_wait(full(stage), (i / kStages) & 1);
      uint8_t* const at = smem + stage * kStageBytes;
      decode_half(a, row, r, (int)(s % p.k_steps) * kStepK + half * kHalf, at + kLoOffset + r * kStepK + half * kHalf,
                  at + kCodesOffset + r * (kStepK / 2) + half * (kHalf / 2), at, row_base, esc, esc_end);
      sm90::fence_proxy_async_smem();  // the generic-proxy writes become visible to wgmma
      sm90::mbar_arrive(decoded(stage));
    }
    return;
  }

  mma_role<kStages>(p, first, count, base, kStageBytes, kXOffset, decoded, empty, &is_last);
}

// The kernel's dynamic shared memory is above the 48 KB default: raise its limit once.
int allow_smem() {
  static const int err = (int)cudaFuncSetAttribute(split12_skinny_kernel,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  return err;
}

}  // namespace

int cuda_split12_skinny_gemm(const Split12SkinnyArgs& a, void* stream) {
  if (a.n < 1 || a.k < 8 || a.k % 8 != 0 || a.m < 1 || a.m > kMaxM) return (int)cudaErrorInvalidValue;
  if (a.partials == nullptr || a.counters == nullptr) return (int)cudaErrorInvalidValue;
  const int64_t steps = total_steps(a.n, a.k), kpad = split12::round_up_kpad(a.k);
  const int ctas = a.ctas > 0 ? (int)std::min<int64_t>(a.ctas, steps) : skinny_ctas(a.n, a.k);
  CUtensorMap lo_map, codes_map, x_map;
  if (!tile_map(&lo_map, a.planes.lo, CU_TENSOR_MAP_DATA_TYPE_UINT8, a.n, kpad, kStepK, kRowsPerCta) ||
      !tile_map(&codes_map, a.planes.codes, CU_TENSOR_MAP_DATA_TYPE_UINT8, a.n, kpad / 2, kStepK / 2, kRowsPerCta) ||
      !tile_map(&x_map, a.x, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, a.m, a.k, kBlockK, kMaxM))
    return (int)cudaErrorInvalidValue;
  if (const int err = allow_smem()) return err;
  const Split12Plan plan{{a.y, a.partials, a.counters, a.n, a.m, (a.k + kStepK - 1) / kStepK, steps},
                         a.planes.base, a.planes.esc_rowptr, a.planes.esc_col, a.planes.esc_val, a.k};
  return split12::launch_kernel(split12_skinny_kernel, dim3(ctas), kThreads, kSmemBytes,
                                static_cast<cudaStream_t>(stream), a.pdl, lo_map, codes_map, x_map, plan);
}

}  // namespace skinny
}  // namespace specpilot
