// Split-KV decode / verify attention (flash-decoding) with mma.sync m16n8k16 bf16 tensor cores.
// Semantics, workspace layout and the key split: csrc/include/specpilot/decode_attention.h.
//
// Exactness: not bit-identical to SDPA (another summation order, and P is rounded to bf16 before
// the P.V product, as in flash attention); within bf16 output rounding of an fp64 softmax (tests/
// test_decode_attention_gpu.py). Deterministic: a fixed order for a given grid (no atomics).
//
// CTA: 4 warps, up to 64 query rows (4 m16 tiles) x one key range, in tiles of 64 keys through a
// two-stage cp.async ring. With one m-tile (T = 1: g rows, padded to 16) the 4 warps split each
// key tile into 16-key steps; with two, 2 warps per m-tile; with 3-4, one warp per m-tile (32-key
// steps for both). Each warp runs its own online softmax. A warp alone on its m-tile writes its
// rows straight from registers; warps sharing one merge through shared memory first.
// Keys past the range are zero-filled (never read), so NaN in unseen cache slots cannot leak.
//
// Merging the key splits: a second kernel (combine_kernel, over the fp32 workspace).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "attention_merge.cuh"
#include "attention_rope_prologue.cuh"
#include "sm90_device.cuh"
#include "specpilot/decode_attention.h"
#include "split12_launch.h"  // launch_kernel (plain or PDL)

namespace specpilot {
namespace attention {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRowsPerCta = 64;   // 4 m16 tiles
constexpr int kKeyTile = 64;      // keys per pipeline stage

template <int D>
struct Smem {
  static constexpr int kPitch = D + 8;         // bf16 per row; +16 B keeps ldmatrix conflict-free
  static constexpr int kQ = kRowsPerCta * kPitch;
  static constexpr int kTile = kKeyTile * kPitch;  // one K or one V tile
  static constexpr int kAccPitch = D + 4;      // floats per row of the merge scratch (reuses K/V)
  static constexpr int kMl = 2 * kWarps * 16;  // m and l of each warp's 16 rows
  static constexpr size_t kBytes = size_t(kQ + 4 * kTile) * 2 + kMl * sizeof(float);
  // In the K/V ring after the key loop: the warps' merge scratch.
  static constexpr int kScratchFloats = kWarps * 16 * kAccPitch;
  static_assert(kScratchFloats * sizeof(float) <= 4 * kTile * 2, "the merge scratch must fit the K/V ring");
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared; with valid == false the destination is zero-filled, nothing is read.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

using sm90::mma_bf16;
using sm90::pdl_launch_dependents;
using sm90::pdl_wait;

// kv_end = clamp(max_t last[t] + 1, 0, span), computed by every lane of the calling warp.
__device__ __forceinline__ int visible_end(const int64_t* last, int tokens, int span, int lane) {
  long long v = lane < tokens ? static_cast<long long>(last[lane]) : -1ll;
  v = v < -1ll ? -1ll : (v > span - 1 ? span - 1 : v);
  int x = static_cast<int>(v);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) x = max(x, __shfl_xor_sync(kFull, x, off));
  return x + 1;
}

// min_t last[t], clamped to [0, span]: with writes_at_last, every key below it is older than the
// kernel this one follows.
__device__ __forceinline__ int settled_end(const int64_t* last, int tokens, int span, int lane) {
  long long v = lane < tokens ? static_cast<long long>(last[lane]) : static_cast<long long>(span);
  v = v < 0ll ? 0ll : (v > span ? span : v);
  int x = static_cast<int>(v);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) x = min(x, __shfl_xor_sync(kFull, x, off));
  return x;
}

// SK: keys per warp step (one online-softmax update): 16 when 4 warps share an m-tile (T = 1),
// 32 otherwise, for four independent Q.K^T mma chains instead of two.
// D = 64: a one-CTA-per-SM bound, else ptxas caps the multi-row kernel at 128 registers and spills
// in its key loop (with it: 156, no spill). D = 128 keeps ptxas's own choice (0), no spill either.
// kPaged: keys through the batch row's page table (PagedKV), `last` per batch row; a template flag,
// so the static-cache kernel compiles as before.
template <int D, int SK, bool kPaged>
__global__ void __launch_bounds__(kThreads, D == 64 ? 1 : 0) split_kernel(const DecodeAttentionArgs a) {
  static_assert(SK == 16 || SK == 32, "a warp step is one or two mma k-steps of P.V");
  using S = Smem<D>;
  constexpr int NT = SK / 8;
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  pdl_launch_dependents();        // the combine kernel (if PDL) may start its prologue now

  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint16_t* sq = reinterpret_cast<uint16_t*>(smem_raw);
  uint16_t* skv = sq + S::kQ;  // stage s: K at skv + 2s * kTile, V right after
  float* sm = reinterpret_cast<float*>(skv + 4 * S::kTile);
  float* sl = sm + kWarps * 16;
  float* sacc = reinterpret_cast<float*>(skv);  // merge scratch, after the last tile

  const int split = blockIdx.x, row0 = blockIdx.y * kRowsPerCta;
  const int b = blockIdx.z / a.kv_heads, kvh = blockIdx.z % a.kv_heads;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int T = a.tokens, g = a.q_heads / a.kv_heads;
  const int rows = min(kRowsPerCta, g * T - row0);
  const int mtiles = (rows + 15) / 16;

  // `last` comes from a kernel that never triggers early (a torch op ahead of the layers), so every
  // later kernel, this one included, started after it ended: it is read before the PDL wait. q and
  // the cache are the previous kernel's until the wait (docs/CONTRACTS.md), except, with
  // writes_at_last, the keys below `settled`: their loads go out before the wait, so that the
  // DRAM latency of this CTA's first tile overlaps the kernel before (the rope / cache write).
  const int64_t* last = kPaged ? a.last + static_cast<long long>(b) * T : a.last;  // this batch row's
  const int kv_end = visible_end(last, T, a.span, lane);
  const SplitGeometry geo = split_geometry(kv_end, a.num_splits);
  const bool direct = a.num_splits == 1;
  const int settled = a.writes_at_last ? settled_end(last, T, a.span, lane) : 0;

  const int kbeg = split * geo.keys_per_split;
  const int kend = min(kbeg + geo.keys_per_split, kv_end);
  const int ntiles = kend > kbeg ? (kend - kbeg + kKeyTile - 1) / kKeyTile : 0;

  const uint16_t* kb = a.k + (kPaged ? 0 : b * a.k_stride[0]) + kvh * a.k_stride[1];  // paged: one pool
  const uint16_t* vb = a.v + (kPaged ? 0 : b * a.v_stride[0]) + kvh * a.v_stride[1];
  const int32_t* table = kPaged ? a.paged.page_table + b * a.paged.table_stride : nullptr;
  // The rows of one tile whose key is in [lo, hi) (keys past kend are zero-filled, never read).
  auto load_tile = [&](int tile, int stage, int lo, int hi) {
    const int base = kbeg + tile * kKeyTile;
    uint16_t* sk = skv + 2 * stage * S::kTile;
    uint16_t* sv = sk + S::kTile;
    if constexpr (kPaged) {
      // A thread copies chunk column tid % kChunks of rows tid / kChunks + n * kRowStep. Every row's
      // page entry is read first (independent loads, one round trip), then the copies go out. A page
      // outside the pool gives slot -1: zero-filled, never out of bounds.
      constexpr int kRowStep = kThreads / kChunks, kRowsPerThread = kKeyTile / kRowStep;
      static_assert(kThreads % kChunks == 0 && kKeyTile % kRowStep == 0, "whole rows per thread");
      const int c = tid % kChunks, r0 = tid / kChunks, shift = a.paged.page_shift;
      int slot[kRowsPerThread];
#pragma unroll
      for (int n = 0; n < kRowsPerThread; ++n) {
        const int key = base + r0 + n * kRowStep;
        const int page = key >= lo && key < hi && key < kend ? __ldg(table + (key >> shift)) : -1;
        slot[n] = -1;
        if (page >= 0) {
          const long long at = (static_cast<long long>(page) << shift) | (key & ((1 << shift) - 1));
          if (at < a.paged.pool_slots) slot[n] = static_cast<int>(at);
        }
      }
#pragma unroll
      for (int n = 0; n < kRowsPerThread; ++n) {
        const int r = r0 + n * kRowStep, key = base + r;
        if (key < lo || key >= hi) continue;
        const bool valid = slot[n] >= 0;
        cp_async16(sk + r * S::kPitch + c * 8, valid ? kb + slot[n] * a.k_stride[2] + c * 8 : a.k, valid);
        cp_async16(sv + r * S::kPitch + c * 8, valid ? vb + slot[n] * a.v_stride[2] + c * 8 : a.v, valid);
      }
    } else {
      for (int i = tid; i < kKeyTile * kChunks; i += kThreads) {
        const int r = i / kChunks, c = i % kChunks, key = base + r;
        if (key < lo || key >= hi) continue;
        const bool valid = key < kend;
        cp_async16(sk + r * S::kPitch + c * 8, valid ? kb + key * a.k_stride[2] + c * 8 : a.k, valid);
        cp_async16(sv + r * S::kPitch + c * 8, valid ? vb + key * a.v_stride[2] + c * 8 : a.v, valid);
      }
    }
  };
  constexpr int kAllKeys = 0x7fffffff;

  if (ntiles > 0) load_tile(0, 0, 0, settled);  // cp.async group 1 of the first tile: settled keys
  cp_async_commit();
  pdl_wait();  // before any exit too: a grid must not finish before the kernel it follows
  // No keys here: the merge skips this split.
  if (!direct && split >= geo.active_splits) return;

  // The rope prologue is T = 1 only (the op refuses other T), so only the one-m-tile kernel (SK = 16)
  // compiles it: in the multi-row kernel it cost register spills. Never paged (the launcher refuses).
  const bool rope = SK == 16 && !kPaged && a.rope.qkv != nullptr;
  if constexpr (SK == 16 && !kPaged) {
    if (rope) rope_prologue<D, S::kPitch, kWarps>(a, sq, b, kvh, g, warp, lane, split == geo.active_splits - 1);
  }
  if (!rope) {  // Q rows -> shared. Row r = j * T + t of this KV head.
    const uint16_t* qb = a.q + b * a.q_stride[0];
    for (int i = tid; i < mtiles * 16 * kChunks; i += kThreads) {
      const int r = i / kChunks, c = i % kChunks, rg = row0 + r;
      const bool valid = r < rows;
      const uint16_t* src = valid ? qb + (kvh * g + rg / T) * a.q_stride[1] + (rg % T) * a.q_stride[2] + c * 8 : a.q;
      cp_async16(sq + r * S::kPitch + c * 8, src, valid);
    }
  }
  if (ntiles > 0) load_tile(0, 0, settled, kAllKeys);  // group 2: Q and the rest of the first tile
  cp_async_commit();

  // Warp roles: m-tile `mi`, and which 16-key slices of each tile (wk, wk + nwk, ...).
  const int nwk = mtiles == 1 ? 4 : (mtiles == 2 ? 2 : 1);
  const int mi = warp / nwk, wk = warp % nwk;
  const bool has_rows = mi < mtiles;
  const int quad_row = lane / 4, quad_col = 2 * (lane % 4);

  // Last visible key of this thread's two rows (quad_row, quad_row + 8) within [kbeg, kend).
  int lim[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = mi * 16 + quad_row + 8 * h;
    long long v = -1;
    if (has_rows && r < rows) {
      v = static_cast<long long>(last[(row0 + r) % T]);
      v = v < -1ll ? -1ll : (v > kend - 1 ? kend - 1 : v);
    }
    lim[h] = static_cast<int>(v);
  }
  int warp_lim = max(lim[0], lim[1]);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) warp_lim = max(warp_lim, __shfl_xor_sync(kFull, warp_lim, off));

  const float scale_log2 = a.scale * 1.4426950408889634f;  // exp(x) = exp2(x log2 e)
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  float acc[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
  uint32_t qa[D / 16][4];

  for (int tile = 0; tile < ntiles; ++tile) {
    if (tile + 1 < ntiles) load_tile(tile + 1, (tile + 1) & 1, 0, kAllKeys);
    cp_async_commit();
    cp_async_wait<1>();  // all but the newest group: Q and this tile have landed
    __syncthreads();
    if (has_rows) {
      if (tile == 0) {
        const uint16_t* qrow = sq + (mi * 16 + ((lane / 8) % 2) * 8 + lane % 8) * S::kPitch + (lane / 16) * 8;
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) ldmatrix_x4(qa[ks], qrow + ks * 16);
      }
      const uint16_t* sk = skv + 2 * (tile & 1) * S::kTile;
      const uint16_t* sv = sk + S::kTile;
      const int base = kbeg + tile * kKeyTile;
      for (int slice = wk; slice < kKeyTile / SK; slice += nwk) {
        const int key0 = base + slice * SK;
        if (key0 > warp_lim) break;  // warp-uniform: no row of this warp sees these keys
        // S = Q K^T for SK keys: SK / 8 n8 tiles, each an independent chain of D / 16 mma.
        float s[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
        const uint16_t* krow = sk + (slice * SK + (lane / 16) * 8 + lane % 8) * S::kPitch + ((lane / 8) % 2) * 8;
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks)
#pragma unroll
          for (int kt = 0; kt < SK / 16; ++kt) {
            uint32_t kf[4];
            ldmatrix_x4(kf, krow + kt * 16 * S::kPitch + ks * 16);
            mma_bf16(s[2 * kt], qa[ks], kf[0], kf[1]);
            mma_bf16(s[2 * kt + 1], qa[ks], kf[2], kf[3]);
          }
        // Mask (select, so NaN in a masked key cannot pass), scale to the log2 domain, row max.
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = key0 + nt * 8 + quad_col + (e & 1);
            s[nt][e] = key <= lim[e >> 1] ? s[nt][e] * scale_log2 : -INFINITY;
            mx[e >> 1] = fmaxf(mx[e >> 1], s[nt][e]);
          }
        float alpha[2], base_m[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          mx[h] = fmaxf(mx[h], __shfl_xor_sync(kFull, mx[h], 1));
          mx[h] = fmaxf(mx[h], __shfl_xor_sync(kFull, mx[h], 2));
          const float m_new = fmaxf(m[h], mx[h]);
          base_m[h] = m_new == -INFINITY ? 0.f : m_new;  // all masked so far: exp2(-inf - 0) = 0, no NaN
          alpha[h] = exp2f(m[h] - base_m[h]);
          m[h] = m_new;
        }
        float rowsum[2] = {0.f, 0.f};
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            s[nt][e] = exp2f(s[nt][e] - base_m[e >> 1]);
            rowsum[e >> 1] += s[nt][e];
          }
        l[0] = l[0] * alpha[0] + rowsum[0];
        l[1] = l[1] * alpha[1] + rowsum[1];
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
          acc[n][0] *= alpha[0];
          acc[n][1] *= alpha[0];
          acc[n][2] *= alpha[1];
          acc[n][3] *= alpha[1];
        }
        // O += P V, one mma k-step per 16 keys: the S accumulator layout is the A-fragment layout.
#pragma unroll
        for (int kt = 0; kt < SK / 16; ++kt) {
          const uint32_t pa[4] = {pack_bf16(s[2 * kt][0], s[2 * kt][1]), pack_bf16(s[2 * kt][2], s[2 * kt][3]),
                                  pack_bf16(s[2 * kt + 1][0], s[2 * kt + 1][1]),
                                  pack_bf16(s[2 * kt + 1][2], s[2 * kt + 1][3])};
          const uint16_t* vrow =
              sv + (slice * SK + kt * 16 + ((lane / 8) % 2) * 8 + lane % 8) * S::kPitch + (lane / 16) * 8;
#pragma unroll
          for (int dn = 0; dn < D / 16; ++dn) {
            uint32_t vf[4];
            ldmatrix_x4_trans(vf, vrow + dn * 16);
            mma_bf16(acc[2 * dn], pa, vf[0], vf[1]);
            mma_bf16(acc[2 * dn + 1], pa, vf[2], vf[3]);
          }
        }
      }
    }
    __syncthreads();  // the next iteration's load overwrites this stage
  }
  cp_async_wait<0>();

  const long long rows_total = static_cast<long long>(a.batch) * T * a.q_heads;
  // Output row of this CTA's row r (r = j * T + t of query head kvh * g + j).
  auto out_row = [&](int r) {
    const int rg = row0 + r;
    return (static_cast<long long>(b) * T + rg % T) * a.q_heads + kvh * g + rg / T;
  };
  float* part_o = a.workspace + static_cast<long long>(split) * rows_total * D;
  float* part_lse = a.workspace + static_cast<long long>(a.num_splits) * rows_total * D + split * rows_total;

  if (nwk == 1) {  // each warp alone on its m-tile: finish in registers, no shared-memory merge
    if (!has_rows) return;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l[h] += __shfl_xor_sync(kFull, l[h], 1);
      l[h] += __shfl_xor_sync(kFull, l[h], 2);
      const int r = mi * 16 + quad_row + 8 * h;
      if (r >= rows) continue;
      const long long orow = out_row(r);
      const float inv = l[h] > 0.f ? 1.f / l[h] : 0.f;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        const float o0 = acc[n][2 * h] * inv, o1 = acc[n][2 * h + 1] * inv;
        if (direct)
          *reinterpret_cast<uint32_t*>(a.out + orow * D + n * 8 + quad_col) = pack_bf16(o0, o1);
        else
          *reinterpret_cast<float2*>(part_o + orow * D + n * 8 + quad_col) = make_float2(o0, o1);
      }
      if (!direct && lane % 4 == 0) part_lse[orow] = l[h] > 0.f ? m[h] + log2f(l[h]) : -INFINITY;
    }
    return;
  }

  __syncthreads();  // the merge scratch reuses the K/V ring
  // Each warp's (m, l, acc) -> shared; l was summed per thread, finish it over the quad.
  if (has_rows) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l[h] += __shfl_xor_sync(kFull, l[h], 1);
      l[h] += __shfl_xor_sync(kFull, l[h], 2);
      if (lane % 4 == 0) {
        sm[warp * 16 + quad_row + 8 * h] = m[h];
        sl[warp * 16 + quad_row + 8 * h] = l[h];
      }
    }
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        *reinterpret_cast<float2*>(sacc + (warp * 16 + quad_row + 8 * h) * S::kAccPitch + n * 8 + quad_col) =
            make_float2(acc[n][2 * h], acc[n][2 * h + 1]);
  }
  __syncthreads();

  // Merge the warps of each m-tile, 4 columns per thread; write the output (direct) or the partial.
  for (int i = tid; i < rows * (D / 4); i += kThreads) {
    const int r = i / (D / 4), d = 4 * (i % (D / 4)), w0 = (r / 16) * nwk, rr = r % 16;
    float mmax = -INFINITY;
    for (int w = w0; w < w0 + nwk; ++w) mmax = fmaxf(mmax, sm[w * 16 + rr]);
    const float base = mmax == -INFINITY ? 0.f : mmax;
    float lsum = 0.f;
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int w = w0; w < w0 + nwk; ++w) {
      const float f = exp2f(sm[w * 16 + rr] - base);
      const float4 x = *reinterpret_cast<const float4*>(sacc + (w * 16 + rr) * S::kAccPitch + d);
      lsum += f * sl[w * 16 + rr];
      o.x += f * x.x;
      o.y += f * x.y;
      o.z += f * x.z;
      o.w += f * x.w;
    }
    const float inv = lsum > 0.f ? 1.f / lsum : 0.f;
    o = make_float4(o.x * inv, o.y * inv, o.z * inv, o.w * inv);
    const long long orow = out_row(r);
    if (direct) {
      *reinterpret_cast<uint2*>(a.out + orow * D + d) = make_uint2(pack_bf16(o.x, o.y), pack_bf16(o.z, o.w));
    } else {
      *reinterpret_cast<float4*>(part_o + orow * D + d) = o;
      if (d == 0) part_lse[orow] = lsum > 0.f ? mmax + log2f(lsum) : -INFINITY;
    }
  }
}

// The combine kernel: one warp per output row (merge_row over the fp32 workspace).
template <int D, bool kPaged>
__global__ void __launch_bounds__(kThreads) combine_kernel(const DecodeAttentionArgs a) {
  const int lane = threadIdx.x % 32;
  const long long rows_total = static_cast<long long>(a.batch) * a.tokens * a.q_heads;
  const long long orow = static_cast<long long>(blockIdx.x) * kWarps + threadIdx.x / 32;
  pdl_launch_dependents();  // the next kernel (the o projection) may start fetching its weights
  // `last` was written before the split kernel started, so it may be read before the PDL wait.
  // Paged: the row's batch row's `last` (a row past the end reads the last batch row's, then exits).
  const int64_t* last = a.last;
  if constexpr (kPaged) {
    const long long b = min(orow / (static_cast<long long>(a.tokens) * a.q_heads), static_cast<long long>(a.batch - 1));
    last += b * a.tokens;
  }
  const int kv_end = visible_end(last, a.tokens, a.span, lane);
  const int active = split_geometry(kv_end, a.num_splits).active_splits;
  pdl_wait();
  if (orow >= rows_total) return;
  const float* part_o = a.workspace + orow * D + lane * (D / 32);
  const float* part_lse = a.workspace + static_cast<long long>(a.num_splits) * rows_total * D + orow;
  merge_row<D, kMaxSplits>(
      active, lane, [&](int s) { return part_lse[s * rows_total]; },
      [&](int s, bool live) {
        const float* ps = part_o + static_cast<long long>(s) * rows_total * D;
        if constexpr (D / 32 == 4)
          return live ? *reinterpret_cast<const float4*>(ps) : make_float4(0.f, 0.f, 0.f, 0.f);
        else
          return live ? *reinterpret_cast<const float2*>(ps) : make_float2(0.f, 0.f);
      },
      a.out + orow * D + lane * (D / 32));
}

template <int D, int SK, bool kPaged>
int launch_rows(const DecodeAttentionArgs& a, cudaStream_t stream) {
  constexpr size_t smem = Smem<D>::kBytes;
  const int rows = (a.q_heads / a.kv_heads) * a.tokens;
  const dim3 grid(a.num_splits, (rows + kRowsPerCta - 1) / kRowsPerCta, a.batch * a.kv_heads);
  auto kernel = split_kernel<D, SK, kPaged>;
  // Set on every launch (cheap, host only, legal under graph capture): the attribute is per device.
  int err = (int)cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (err != 0) return err;
  err = split12::launch_kernel(kernel, grid, kThreads, (int)smem, stream, a.pdl, a);
  if (err != 0 || a.num_splits == 1) return err;
  const long long out_rows = static_cast<long long>(a.batch) * a.tokens * a.q_heads;
  const dim3 combine_grid(static_cast<unsigned>((out_rows + kWarps - 1) / kWarps));
  return split12::launch_kernel(combine_kernel<D, kPaged>, combine_grid, kThreads, 0, stream, a.pdl, a);
}

// One m16 tile per CTA (T = 1 with g <= 16, SK = 16): four warps split each key tile, 16 keys each.
template <int D, bool kPaged>
int launch_layout(const DecodeAttentionArgs& a, cudaStream_t stream) {
  const int rows = (a.q_heads / a.kv_heads) * a.tokens;
  return rows <= 16 ? launch_rows<D, 16, kPaged>(a, stream) : launch_rows<D, 32, kPaged>(a, stream);
}

template <int D>
int launch(const DecodeAttentionArgs& a, cudaStream_t stream) {
  if (a.paged.page_table == nullptr) return launch_layout<D, false>(a, stream);
  // No rope prologue over a page pool; page_shift keeps (page << shift) and the key mask in range.
  if (a.rope.qkv != nullptr || a.paged.page_shift < 0 || a.paged.page_shift > 20) return (int)cudaErrorInvalidValue;
  return launch_layout<D, true>(a, stream);
}

}  // namespace

int cuda_decode_attention(const DecodeAttentionArgs& args, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (args.head_dim) {
    case 64: return launch<64>(args, s);
    case 128: return launch<128>(args, s);
    default: return (int)cudaErrorInvalidValue;
  }
}

}  // namespace attention
}  // namespace specpilot
