// The skinny GEMM (M <= 16) for split12 weights: semantics in specpilot/skinny_gemm.h.
//
// The bf16 kernel (skinny_gemm.cu) with a decode stage in the ring. TMA brings a step's `lo` plane
// (64 rows x 256 bytes) and `codes` plane (64 x 128 bytes) as plain uint8 boxes, 24 KB instead of
// the 32 KB of bf16, with x as before. Decoder warps turn them into the four 128-byte swizzled bf16
// boxes that TMA would have written for the unpacked weights (+0 past N and K, escapes substituted
// from the row's list), and the MMA warpgroup runs the very wgmmas and segment flush of the bf16
// kernel on them (skinny_common.cuh): the output is bit-identical to skinny_gemm on the unpacked
// weights with the same grid.
//
// Two rings, so that the TMA runs ahead of the decode and the decode ahead of the MMA: a raw stage
// (32 KB: lo 16 KB | codes 8 KB | x 8 KB, 4 stages) is free again as soon as it is decoded; a
// decoded stage (40 KB: bf16 tiles 32 KB | x 8 KB copied from the raw stage, 2 stages) as soon as
// the MMA is done with it. 208 KB, one CTA per SM. Barriers: raw_full (TMA bytes), raw_empty and
// dec_full (one arrival per decoder thread), dec_empty (128 MMA arrivals).
// Roles: threads 0-127 MMA (the warpgroup skinny_common's flush expects), then kDecoders decoder
// threads (8 warps), then the producer. Decoder warp w owns rows 8w .. 8w + 7 of the block and
// decodes one row per turn, lane l the 8 columns 8l .. 8l + 7: the lanes read 256 contiguous `lo`
// bytes and 128 contiguous `codes` bytes and write one 128-byte swizzled row per 8 lanes, so no
// shared-memory access has a bank conflict. A warp loads all its rows before decoding any.
// Escapes: lane l < 8 keeps row 8w + l's cursor into its escape list (a segment walks K in order),
// with the next two escapes already in registers, and writes them over the decoded tile after a
// __syncwarp. The next segment's bases and escape cursors are loaded during this one: a global
// load on the decoder's path stalls the whole ring (~1 us each).
// The decode is the limit (the MMA warps wait on it; Nsight Compute), so each step's decoder work
// is kept small: no division, no branch per row; the version history is in docs/PERF_NOTES.md.
//
// Measured on the H200 in docs/PERF_NOTES.md; bit-identical to the bf16 kernel on the host
// (tests/test_skinny_gemm_emulation.py) and on the GPU (tests/test_skinny_gemm_gpu.py).
#include "skinny_common.cuh"
#include "split12_launch.h"  // sm_count, launch_kernel

namespace specpilot {
namespace skinny {
namespace {

constexpr int kRawStages = 4;
constexpr int kDecStages = 2;
constexpr int kDecoders = 256;
constexpr int kThreads = kConsumers + kDecoders + 32;
constexpr int kLoBytes = kRowsPerCta * kStepK;        // one byte per weight
constexpr int kCodesBytes = kRowsPerCta * kStepK / 2;  // one nibble per weight
constexpr int kXBytes = kBoxes * kXTileBytes;
constexpr int kRawXOffset = kLoBytes + kCodesBytes;    // 1024-byte aligned: x is swizzled
constexpr int kRawBytes = kRawXOffset + kXBytes;
constexpr int kDecXOffset = kBoxes * kWTileBytes;
constexpr int kDecBytes = kDecXOffset + kXBytes;       // multiple of 1024: tiles stay aligned
constexpr int kDecRing = kRawStages * kRawBytes;       // where the decoded ring starts
constexpr int kBarriers = 2 * (kRawStages + kDecStages);
constexpr int kSmemBytes = kDecRing + kDecStages * kDecBytes + 8 * kBarriers + 1024;  // + alignment slack
static_assert(kRawXOffset % 1024 == 0 && kRawBytes % 1024 == 0 && kDecBytes % 1024 == 0, "swizzled tiles");
static_assert(kXBytes % (16 * kDecoders) == 0, "the decoders copy x in 16-byte pieces");

struct Split12Plan {
  Plan plan;
  const uint8_t* base;
  const int32_t* esc_rowptr;
  const int32_t* esc_col;
  const uint16_t* esc_val;
  int k;
};

constexpr int kRowsPerWarp = kRowsPerCta / (kDecoders / 32);

// 8 weights of one row -> 8 bf16 (the format's decode8, byte_perm: ~12 integer ops). base4 = 0 on
// zero-filled planes (rows past N, columns past K) gives +0.
__device__ __forceinline__ uint4 decode8(uint32_t codes, uint2 lo, uint32_t base4) {
  uint32_t w[4];
  split12::decode8(codes, lo.x, lo.y, base4, w);
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Byte offset of (row r, column kl of the step) in the stage's four 128-byte-swizzled boxes.
__device__ __forceinline__ int tile_offset(int r, int kl) {
  return (kl / kBlockK) * kWTileBytes + r * 128 + ((((kl % kBlockK) / 8) ^ (r % 8)) * 16) + (kl % 8) * 2;
}

// One decoder warp's rows of a block (first row `row0` of the matrix) at step columns [c0, c0 + kStepK).
// Loaded in two parts, a segment ahead: `fetch_rows` (bases, escape cursors: independent loads),
// then `fetch_escapes` (the first two escapes: loads that need the cursors).
struct DecoderRows {
  uint32_t base4[kRowsPerWarp];  // the rows' exponent bases in every byte, 0 past N (every lane holds all)
  int next = 0, end = 0;        // lane l < kRowsPerWarp: row l's next escape to load, and its end
  int col0 = INT32_MAX, col1 = INT32_MAX;  // the next two escapes' columns (INT32_MAX: none) ...
  uint16_t val0 = 0, val1 = 0;              // ... and values

  __device__ __forceinline__ void fetch_rows(const Split12Plan& a, int row0, int lane) {
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) base4[i] = row0 + i < a.plan.n ? a.base[row0 + i] * 0x01010101u : 0u;
    const bool mine = lane < kRowsPerWarp && row0 + lane < a.plan.n;
    next = mine ? a.esc_rowptr[row0 + lane] : 0;
    end = mine ? a.esc_rowptr[row0 + lane + 1] : 0;
  }

  __device__ __forceinline__ void load_next(const Split12Plan& a, int& col, uint16_t& val) {
    col = next < end ? a.esc_col[next] : INT32_MAX;
    val = next < end ? a.esc_val[next] : (uint16_t)0;
    ++next;
  }

  __device__ __forceinline__ void fetch_escapes(const Split12Plan& a) {
    load_next(a, col0, val0);
    load_next(a, col1, val1);
  }

  // Decode rows r0 .. r0 + kRowsPerWarp - 1 of the tile from the raw planes into `tiles`.
  __device__ __forceinline__ void decode(const Split12Plan& a, int r0, int c0, int lane, const uint8_t* lo,
                                         const uint8_t* codes, uint8_t* tiles) {
    const bool in_k = c0 + 8 * lane < a.k;  // K % 8 == 0: a lane's 8 columns are all in K or all out
    // Every load first, then every decode and store: one shared-memory latency per step instead of
    // one per row (the compiler keeps loads behind earlier stores it cannot prove apart). Rows past
    // N and columns past K are in the box too, zero-filled: with base 0 they decode to +0.
    uint32_t code_words[kRowsPerWarp];
    uint2 lo_words[kRowsPerWarp];
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      code_words[i] = *reinterpret_cast<const uint32_t*>(codes + (r0 + i) * (kStepK / 2) + 4 * lane);
      lo_words[i] = *reinterpret_cast<const uint2*>(lo + (r0 + i) * kStepK + 8 * lane);
    }
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i)
      *reinterpret_cast<uint4*>(tiles + tile_offset(r0 + i, 8 * lane)) =
          decode8(code_words[i], lo_words[i], in_k ? base4[i] : 0u);
    __syncwarp();  // the decoded rows are in place before escapes overwrite some of their weights
    while (col0 < c0 + kStepK) {  // lane < kRowsPerWarp only (the others have none); escapes are rare
      if (col0 >= c0)             // a segment starting mid-row skips the row's earlier escapes
        *reinterpret_cast<uint16_t*>(tiles + tile_offset(r0 + lane, col0 - c0)) = val0;
      col0 = col1;  // loaded a while ago: only a third escape in one step waits for memory
      val0 = val1;
      load_next(a, col1, val1);
    }
  }
};

__global__ void __launch_bounds__(kThreads) split12_skinny_kernel(const __grid_constant__ CUtensorMap lo_map,
                                                                  const __grid_constant__ CUtensorMap codes_map,
                                                                  const __grid_constant__ CUtensorMap x_map,
                                                                  const Split12Plan a) {
  extern __shared__ uint8_t smem_raw[];
  __shared__ int is_last;
  const uint32_t base = (sm90::smem_u32(smem_raw) + 1023) & ~1023u;  // swizzled tiles: 1024-byte aligned
  uint8_t* const smem = smem_raw + (base - sm90::smem_u32(smem_raw));
  const uint32_t bars = base + kDecRing + kDecStages * kDecBytes;
  auto raw_full = [&](int stage) { return bars + 8 * stage; };                                 // TMA bytes landed
  auto raw_empty = [&](int stage) { return bars + 8 * (kRawStages + stage); };                 // decoded
  auto dec_full = [&](int stage) { return bars + 8 * (2 * kRawStages + stage); };              // tiles written
  auto dec_empty = [&](int stage) { return bars + 8 * (2 * kRawStages + kDecStages + stage); };  // MMA done
  sm90::pdl_launch_dependents();  // the next kernel (if PDL) may start its own weight loads now

  if (threadIdx.x == 0) {
    for (int s = 0; s < kRawStages; ++s) {
      sm90::mbar_init(raw_full(s), 1);
      sm90::mbar_init(raw_empty(s), kDecoders);
    }
    for (int s = 0; s < kDecStages; ++s) {
      sm90::mbar_init(dec_full(s), kDecoders);
      sm90::mbar_init(dec_empty(s), kConsumers);
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
      const int stage = i % kRawStages;
      const uint32_t at = base + stage * kRawBytes;
      const int step = (int)(s % p.k_steps), row = (int)(s / p.k_steps) * kRowsPerCta;
      sm90::mbar_arrive_expect_tx(raw_full(stage), kRawBytes);
      sm90::tma_load_2d_evict_first(at, &lo_map, step * kStepK, row, raw_full(stage));
      sm90::tma_load_2d_evict_first(at + kLoBytes, &codes_map, step * kStepK / 2, row, raw_full(stage));
    };
    auto load_x = [&](int i) {
      const int stage = i % kRawStages;
      load_x_step(base + stage * kRawBytes + kRawXOffset, &x_map, first + i, p.k_steps, raw_full(stage));
    };
    producer_role<kRawStages>(count, load_planes, load_x, raw_empty);
    return;
  }

  if (threadIdx.x >= kConsumers) {  // decoder: the planes never change, so no PDL wait
    const int d = threadIdx.x - kConsumers, lane = threadIdx.x % 32, r0 = d / 32 * kRowsPerWarp;
    const int last_block = count > 0 ? (int)((first + count - 1) / p.k_steps) : -1;
    int block = (int)(first / p.k_steps), kstep = (int)(first % p.k_steps);  // then counted, not divided
    DecoderRows rows, ahead;   // this segment's rows, and the next segment's being loaded
    bool ahead_ready = false;  // whether `ahead` has its escapes too
    if (count > 0) {
      rows.fetch_rows(a, block * kRowsPerCta + r0, lane);
      rows.fetch_escapes(a);
      if (block < last_block) ahead.fetch_rows(a, (block + 1) * kRowsPerCta + r0, lane);
    }
    for (int i = 0; i < count; ++i) {
      if (i > 0 && kstep == 0) {  // a new segment: the next block (a CTA's segments are consecutive)
        ++block;
        if (!ahead_ready) ahead.fetch_escapes(a);
        rows = ahead;
        ahead_ready = false;
        if (block < last_block) ahead.fetch_rows(a, (block + 1) * kRowsPerCta + r0, lane);
      } else if (i > 0 && !ahead_ready && block < last_block) {  // a step later: the cursors have landed
        ahead.fetch_escapes(a);
        ahead_ready = true;
      }
      const int rs = i % kRawStages, ds = i % kDecStages;
      sm90::mbar_wait(raw_full(rs), (i / kRawStages) & 1);
      if (i >= kDecStages) sm90::mbar_wait(dec_empty(ds), (i / kDecStages - 1) & 1);
      const uint8_t* const raw = smem + rs * kRawBytes;
      uint8_t* const dec = smem + kDecRing + ds * kDecBytes;
      rows.decode(a, r0, kstep * kStepK, lane, raw, raw + kLoBytes, dec);
#pragma unroll
      for (int j = 0; j < kXBytes / (16 * kDecoders); ++j)  // x moves on with the tiles
        reinterpret_cast<uint4*>(dec + kDecXOffset)[d + kDecoders * j] =
            reinterpret_cast<const uint4*>(raw + kRawXOffset)[d + kDecoders * j];
      sm90::fence_proxy_async_smem();  // the generic-proxy writes become visible to wgmma
      sm90::mbar_arrive(dec_full(ds));
      sm90::mbar_arrive(raw_empty(rs));
      if (++kstep == p.k_steps) kstep = 0;
    }
    return;
  }

  mma_role<kDecStages>(p, first, count, base + kDecRing, kDecBytes, kDecXOffset, dec_full, dec_empty, &is_last);
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
