// The split12 one-token GEMV (M = 1) that streams the weights through shared memory:
// y = W x in the reduction order of split12_format.h, so bit-identical to every other split12 and
// bf16-twin linear kernel (the lane-tree order; the host emulation and the GPU tests check it).
//
// Why a ring: the register-fed kernels (split12_kernel.cuh) hold at most a few chunks per lane in
// flight and cannot start loading before the previous kernel ends, which costs the small shapes
// most (docs/PERF_NOTES.md). Here 1-D bulk copies (TMA without a tensor map) keep kRingDepth = 2
// stages of 3 KB per warp in flight, 96 KB per SM, and they go out before griddepcontrol.wait (the kernel
// always launches with PDL); the lanes only read shared memory, decode and multiply. Two stages, not
// four: the copies a CTA issues before the wait compete with the previous kernel's last CTAs, whose
// end the wait is for; four stages cost 4-15% per shape (docs/PERF_NOTES.md).
//
// Work split: one CTA of kWarps warps per SM (<= 128 registers per thread). Each warp owns rows n = warp, warp + all warps, ...
// (every SM gets the same number of rows, +-1 per warp: one row per warp turn balances the Qwen3
// shapes to within 3%) and its own ring: a stage is kStageCols columns of the row (lo 2 KB | codes
// 1 KB); lane 0 issues its two bulk copies on the slot's mbarrier and refills the slot once the warp
// has used it. No producer warp, no block-wide barrier after x is staged.
// Per stage, lane l takes the chunks l and l + 32 of the stage, i.e. the row's chunks l, l + 32,
// l + 64, ... in ascending order: the format's fmaf chain per lane; the butterfly at the row's end
// is the format's tree.
// x is staged once per CTA in a lane-major layout (16-byte piece q of chunk c at (q * chunks + c)
// * 16), so the lanes' x reads are contiguous and conflict-free. (The norm / gate prologues staged
// here measured slower in the AR step than the separate kernels: docs/design_notes_deleted.md.)
// Escapes: a row's escape list (<= kEscSlots entries) is loaded by the lanes during the previous
// row and kept in shared memory, so the format's per-lane cursor walks shared memory; a row with
// more escapes walks the global list (correct, slower). Row tables (base, escape range) are loaded
// two rows ahead: a global load on a warp's path costs about a stage.
// Code size matters: the first version (2 rows per warp, unrolled 32-way escape tests, a separate
// tail path) stalled a quarter of its cycles on instruction fetch (Nsight Compute).
//
// Compiles under nvcc and, with stand-ins for the device headers, on the host
// (tests/test_split12_stream_emulation.py).
#include "sm90_device.cuh"
#include "split12_kernel.cuh"  // kNoEscape, the bf16 -> fp32 halves
#include "split12_launch.h"    // sm_count, launch_kernel

namespace specpilot {
namespace split12 {
namespace {

constexpr int kWarps = 16;
constexpr int kThreads = 32 * kWarps;
constexpr int kStageCols = 2048;                                 // columns of the row per stage
constexpr int kStageLaneChunks = kStageCols / kChunk / kLanes;   // chunks per lane per stage (2)
constexpr int kStageBytes = kStageCols + kStageCols / 2;         // lo | codes: 3 KB
constexpr int kRingDepth = 2;                                    // stages in flight per warp
constexpr int kEscSlots = 32;                                    // one escape per lane
// Shared memory: escapes | barriers | x (2 * kpad bytes) | the warps' rings (depth stages each).
constexpr int kEscBytes = kWarps * kEscSlots * 8;                // int32 column + uint16 value (padded)
constexpr int kBarOffset = kEscBytes;
constexpr int kXOffset = kBarOffset + kWarps * kRingDepth * 8;
// One CTA per SM. (Two CTAs of 8 warps, <= 113 KB each, so that the next kernel's CTA could start
// beside a finishing one, measured slower on every Qwen3-8B shape: docs/PERF_NOTES.md; and again in
// the engine's split12 AR step, 4.13 vs 4.05 ms.)
constexpr int kCtaSmem = 232448;  // the H100 / H200 opt-in limit per block
constexpr uint32_t kNegZeroBf16 = 0x8000u;                       // x past K: -0 (see accumulate)
static_assert(kStageLaneChunks * kLanes * kChunk == kStageCols, "a stage is whole lane sweeps");

// One row's tables, every lane holding the same values.
struct RowTables {
  uint32_t base4;  // base in every byte
  int e, e_end;    // the row's escape range
};

__device__ __forceinline__ RowTables load_tables(const Split12Planes& w, int n) {
  return RowTables{(uint32_t)__ldg(w.base + n) * 0x01010101u, __ldg(w.esc_rowptr + n), __ldg(w.esc_rowptr + n + 1)};
}

// The row's escapes, lane j holding escape e + j; loaded only when they all fit.
struct EscapeBatch {
  int col;
  uint32_t val;
};

__device__ __forceinline__ bool batch_fits(const RowTables& t) { return t.e_end - t.e <= kEscSlots; }

__device__ __forceinline__ EscapeBatch load_batch(const Split12Planes& w, const RowTables& t, int lane) {
  EscapeBatch b{kNoEscape, 0u};
  const int i = t.e + lane;
  if (batch_fits(t) && i < t.e_end) {
    b.col = __ldg(w.esc_col + i);
    b.val = __ldg(w.esc_val + i);
  }
  return b;
}

// A lane's cursor over the row's escapes (sorted by column): the shared copy (index - first) or,
// for a row with more than kEscSlots, the global list (first = 0).
struct Cursor {
  const int32_t* col_of;
  const uint16_t* val_of;
  int first, e, e_end, col;  // col: the next escape's column, kNoEscape past the row's end

  __device__ __forceinline__ void next() {
    ++e;
    col = e < e_end ? col_of[e - first] : kNoEscape;
  }
};

// 32 columns of the row as bf16 pairs (word i: columns 2i, 2i + 1): decode, escapes in place (rare),
// columns past K set to +0 (the tail chunk).
__device__ __forceinline__ void decode_chunk(const uint4& l0, const uint4& l1, const uint4& cw, uint32_t base4,
                                             Cursor& cur, int col0, int K, uint32_t (&w)[16]) {
  decode8(cw.x, l0.x, l0.y, base4, &w[0]);
  decode8(cw.y, l0.z, l0.w, base4, &w[4]);
  decode8(cw.z, l1.x, l1.y, base4, &w[8]);
  decode8(cw.w, l1.z, l1.w, base4, &w[12]);
  while (cur.col < col0) cur.next();  // other lanes' escapes
  while (cur.col < col0 + kChunk) {
    const int j = cur.col - col0;
    const uint32_t v = cur.val_of[cur.e - cur.first];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      // An opaque copy of j / 2 per i: otherwise the compiler folds the 16 tests into w[j / 2], a
      // computed index, and keeps w in local memory on every path.
      int word = j / 2;
      asm volatile("" : "+r"(word));
      if (word == i) w[i] = (j & 1) ? ((w[i] & 0x0000FFFFu) | (v << 16)) : ((w[i] & 0xFFFF0000u) | v);
    }
    cur.next();
  }
  if (col0 + kChunk > K) {
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      if (col0 + 2 * i >= K) w[i] = 0u;
      else if (col0 + 2 * i + 1 >= K) w[i] &= 0x0000FFFFu;
    }
  }
}

// The row's fmaf chain over one chunk, columns ascending. Columns past K hold w = +0 and x = -0:
// their product is -0 and acc + (-0) == acc for every acc (+0 included), so adding them changes no
// bit: the same result as the format's "k < K only" and one code path for every chunk.
__device__ __forceinline__ float accumulate(const uint32_t (&w)[16], const uint4 (&xv)[4], float acc) {
  const uint32_t xw[16] = {xv[0].x, xv[0].y, xv[0].z, xv[0].w, xv[1].x, xv[1].y, xv[1].z, xv[1].w,
                           xv[2].x, xv[2].y, xv[2].z, xv[2].w, xv[3].x, xv[3].y, xv[3].z, xv[3].w};
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    acc = __fmaf_rn(lo_half_to_float(xw[i]), lo_half_to_float(w[i]), acc);
    acc = __fmaf_rn(hi_half_to_float(xw[i]), hi_half_to_float(w[i]), acc);
  }
  return acc;
}

struct StreamArgs {
  Split12Planes w;
  const uint16_t* x;
  uint16_t* y;
  int N, K, kpad;
  bool xvec;            // x 16-byte aligned and K % 8 == 0
};

// x of any K and alignment is staged; `depth` stages in flight per warp.
__global__ void __launch_bounds__(kThreads, 1) split12_stream_kernel(const StreamArgs a, const int depth) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int chunks = a.kpad / kChunk;
  const int all_warps = gridDim.x * kWarps;
  const int first_row = blockIdx.x * kWarps + warp;
  const int my_rows = first_row < a.N ? (a.N - 1 - first_row) / all_warps + 1 : 0;
  const int stages_per_row = (a.kpad + kStageCols - 1) / kStageCols;
  const int my_stages = my_rows * stages_per_row;
  int32_t* const esc_col_s = reinterpret_cast<int32_t*>(smem) + warp * kEscSlots * 2;
  uint16_t* const esc_val_s = reinterpret_cast<uint16_t*>(esc_col_s + kEscSlots);
  const uint32_t bars = sm90::smem_u32(smem + kBarOffset) + warp * kRingDepth * 8;
  uint16_t* const xs = reinterpret_cast<uint16_t*>(smem + kXOffset);
  uint8_t* const ring = smem + kXOffset + 2 * a.kpad + warp * depth * kStageBytes;

  pdl_launch_dependents();
  // Stage g: row g / stages_per_row, columns from (g % stages_per_row) * kStageCols, into slot
  // s = g % depth (the caller knows it).
  auto issue = [&](int g, int s) {
    const int k = g / stages_per_row, t = g - k * stages_per_row;
    const int64_t n = first_row + (int64_t)k * all_warps;
    const int col = t * kStageCols, cols = min(kStageCols, a.kpad - col);
    const uint32_t slot = sm90::smem_u32(ring + s * kStageBytes), bar = bars + s * 8;
    sm90::mbar_arrive_expect_tx(bar, cols + cols / 2);
    sm90::bulk_load_evict_first(slot, a.w.lo + n * a.kpad + col, cols, bar);
    sm90::bulk_load_evict_first(slot + kStageCols, a.w.codes + n * (a.kpad / 2) + col / 2, cols / 2, bar);
  };
  // The weights do not depend on the previous kernel: their copies go out before pdl_wait.
  if (lane == 0) {
    for (int s = 0; s < depth; ++s) sm90::mbar_init(bars + s * 8, 1);
    sm90::mbar_init_fence();
    for (int g = 0; g < depth && g < my_stages; ++g) issue(g, g);
  }
  RowTables cur{}, next{}, after{};
  if (my_rows > 0) cur = load_tables(a.w, first_row);
  if (my_rows > 1) next = load_tables(a.w, first_row + all_warps);
  EscapeBatch batch = my_rows > 0 ? load_batch(a.w, cur, lane) : EscapeBatch{kNoEscape, 0u};

  pdl_wait();  // x may come from the previous kernel, y may still be read by it
  auto stage_piece = [&](int piece, const uint4& v) {  // columns 8 piece .. 8 piece + 7
    *reinterpret_cast<uint4*>(xs + ((int64_t)(piece % 4) * chunks + piece / 4) * 8) = v;
  };
  for (int piece = threadIdx.x; piece < a.kpad / 8; piece += kThreads) {
    const int k0 = 8 * piece;
    uint4 v;
    if (a.xvec && k0 + 8 <= a.K) {
      v = __ldg(reinterpret_cast<const uint4*>(a.x + k0));
    } else {  // the tail (-0 past K) or an unaligned x
      uint32_t h[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) h[j] = k0 + j < a.K ? (uint32_t)__ldg(a.x + k0 + j) : kNegZeroBf16;
      v = make_uint4(h[0] | h[1] << 16, h[2] | h[3] << 16, h[4] | h[5] << 16, h[6] | h[7] << 16);
    }
    stage_piece(piece, v);
  }
  __syncthreads();

  float acc = 0.0f;
  Cursor cursor{};
  int row = 0, t = 0;  // the stage's row (index among this warp's) and its place in the row
  int slot_index = 0, phase = 0;  // g % depth and (g / depth) & 1, without a division per stage
  for (int g = 0; g < my_stages; ++g) {
    if (t == 0) {  // a row starts: its escapes into shared memory, the next rows' tables out
      __syncwarp();  // every lane is done with the previous row's copy
      esc_col_s[lane] = batch.col;
      esc_val_s[lane] = (uint16_t)batch.val;
      __syncwarp();
      cursor = batch_fits(cur) ? Cursor{esc_col_s, esc_val_s, cur.e, cur.e, cur.e_end, 0}
                               : Cursor{a.w.esc_col, a.w.esc_val, 0, cur.e, cur.e_end, 0};
      cursor.col = cur.e < cur.e_end ? cursor.col_of[cur.e - cursor.first] : kNoEscape;
      if (row + 1 < my_rows) batch = load_batch(a.w, next, lane);
      if (row + 2 < my_rows) after = load_tables(a.w, first_row + (row + 2) * all_warps);
      acc = 0.0f;
    }
    sm90::mbar_wait(bars + slot_index * 8, phase);
    const uint8_t* const slot = ring + slot_index * kStageBytes;

    uint4 lo[kStageLaneChunks][2], cw[kStageLaneChunks], xv[kStageLaneChunks][4];
#pragma unroll
    for (int i = 0; i < kStageLaneChunks; ++i) {  // every shared load before any use
      const int cl = lane + kLanes * i, c = min(t * (kStageCols / kChunk) + cl, chunks - 1);
      lo[i][0] = *reinterpret_cast<const uint4*>(slot + kChunk * cl);
      lo[i][1] = *reinterpret_cast<const uint4*>(slot + kChunk * cl + 16);
      cw[i] = *reinterpret_cast<const uint4*>(slot + kStageCols + 16 * cl);
#pragma unroll
      for (int q = 0; q < 4; ++q) xv[i][q] = *reinterpret_cast<const uint4*>(xs + ((int64_t)q * chunks + c) * 8);
    }
#pragma unroll
    for (int i = 0; i < kStageLaneChunks; ++i) {
      const int c = t * (kStageCols / kChunk) + lane + kLanes * i;
      if (c < chunks) {  // a short last stage
        uint32_t w[16];
        decode_chunk(lo[i][0], lo[i][1], cw[i], cur.base4, cursor, c * kChunk, a.K, w);
        acc = accumulate(w, xv[i], acc);
      }
    }
    __syncwarp();  // every lane has read the slot
    if (lane == 0 && g + depth < my_stages) {
      sm90::fence_proxy_async_smem();
      issue(g + depth, slot_index);  // the slot just read
    }
    if (++slot_index == depth) {
      slot_index = 0;
      phase ^= 1;
    }

    if (++t == stages_per_row) {  // the row ends: the tree, then y
#pragma unroll
      for (int off = kLanes / 2; off >= 1; off /= 2) acc = acc + __shfl_xor_sync(0xFFFFFFFFu, acc, off);
      if (lane == 0) a.y[first_row + row * all_warps] = f32_bits_to_bf16_rne(__float_as_uint(acc));
      t = 0;
      ++row;
      cur = next;
      next = after;
    }
  }
}

int smem_bytes(int kpad, int depth) { return kXOffset + 2 * kpad + kWarps * depth * kStageBytes; }

// The ring's depth where it fits beside x; 0 if it does not.
int ring_depth(int kpad) { return smem_bytes(kpad, kRingDepth) <= kCtaSmem ? kRingDepth : 0; }

int launch_stream(const StreamArgs& args, bool pdl, cudaStream_t stream) {
  const int depth = args.K >= 1 ? ring_depth(args.kpad) : 0;
  if (args.N < 1 || depth == 0) return (int)cudaErrorInvalidValue;
  static const int allowed =
      (int)cudaFuncSetAttribute(split12_stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kCtaSmem);
  if (allowed != 0) return allowed;
  const int grid = min(sm_count(), (args.N + kWarps - 1) / kWarps);
  return launch_kernel(split12_stream_kernel, grid, kThreads, smem_bytes(args.kpad, depth), stream, pdl, args, depth);
}

}  // namespace

bool split12_stream_gemv_fits(int K) { return K >= 1 && ring_depth((int)round_up_kpad(K)) > 0; }

int cuda_split12_stream_gemv(const uint16_t* x, const uint8_t* lo, const uint8_t* codes, const uint8_t* base,
                             const int32_t* esc_rowptr, const int32_t* esc_col, const int16_t* esc_val, int N, int K,
                             uint16_t* y, void* stream) {
  const StreamArgs args{{lo, codes, base, esc_rowptr, esc_col, reinterpret_cast<const uint16_t*>(esc_val)},
                        x,
                        y,
                        N,
                        K,
                        (int)round_up_kpad(K),
                        K % 8 == 0 && (reinterpret_cast<uintptr_t>(x) & 15u) == 0};
  // PDL always: the kernel waits for the previous grid before it touches x or y.
  return launch_stream(args, true, static_cast<cudaStream_t>(stream));
}

}  // namespace split12
}  // namespace specpilot
