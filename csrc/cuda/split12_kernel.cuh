// The CUDA-core linear kernel shared by split12 and its bf16 twin, every M in 1..32. Device code
// only, no torch and no std headers, so NVRTC compiles it too (agent variants of split12_gemv).
//
// Work split = the reduction order of split12_format.h: one warp owns R rows; lane l walks the
// 32-column chunks l, l+32, ... of those rows, keeping one fp32 fmaf chain per (row, token), then a
// __shfl_xor butterfly. R, MT, U, the block size and the load path change only speed, never a bit.
// Weights stream with evict-first 16-byte loads (split12: 2x lo + 1x codes per 32 columns; bf16:
// 4x); x comes through the read-only cache and is reused across the R rows.
// Latency hiding: a lane issues the raw loads of U of its chunks (fetch) before it decodes and
// adds the first (decode + accumulate, chunks still ascending), so U * R * 48 bytes per lane are in
// flight instead of R * 48; the fmaf order per lane is unchanged.
#pragma once

#include "specpilot/split12_format.h"

namespace specpilot {
namespace split12 {

constexpr int kNoEscape = 0x7FFFFFFF;

// Programmatic dependent launch (sm_90). pdl_launch_dependents: the next kernel of the stream may
// launch now (it prefetches its weights, then waits for this grid). pdl_wait: wait until the
// previous kernel is complete and its writes visible, so call it before reading x or writing y.
// Both are no-ops for a grid launched without the PDL attribute (every launch but variant 4).
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ float lo_half_to_float(uint32_t pair) { return __uint_as_float(pair << 16); }
__device__ __forceinline__ float hi_half_to_float(uint32_t pair) { return __uint_as_float(pair & 0xFFFF0000u); }

// ---- weight sources: load_chunk(state, c, w) fills 32 columns 32c..32c+31 of one row; it is
// fetch (issue the raw 16-byte loads) + decode (bf16x2 words, escapes in place), split so callers
// can keep several chunks in flight ----

struct Split12Source : Split12Planes {
  int kpad;

  struct Row {
    const uint4* lo;     // this row's lo plane, 32 bytes per chunk
    const uint4* codes;  // this row's codes plane, 16 bytes per chunk
    uint32_t base4;      // base in every byte
    int e, e_end, e_col; // escape cursor: next escape index, row end, its column (kNoEscape if none)
  };

  // The plane pointers only (no loads): enough for fetch / raw_src.
  __device__ __forceinline__ Row row_planes(int n) const {
    Row r;
    r.lo = reinterpret_cast<const uint4*>(lo + (int64_t)n * kpad);
    r.codes = reinterpret_cast<const uint4*>(codes + (int64_t)n * (kpad / 2));
    return r;
  }

  // Base and escape cursor, needed by decode. esc_col waits on esc_rowptr (two latencies in a
  // row), so latency-hiding callers issue their weight loads before calling this.
  __device__ __forceinline__ void row_tables(Row& r, int n) const {
    row_bounds(r, n);
    escape_cursor(r);
  }

  // row_tables in two halves, for kernels that prefetch a row one step ahead: row_bounds issues
  // the independent loads (base, escape range) beside the weights; escape_cursor, called when the
  // row's first chunk is decoded, reads the first escape's column (rows without escapes: no load).
  __device__ __forceinline__ void row_bounds(Row& r, int n) const {
    r.base4 = (uint32_t)__ldg(base + n) * 0x01010101u;
    r.e = __ldg(esc_rowptr + n);
    r.e_end = __ldg(esc_rowptr + n + 1);
  }

  __device__ __forceinline__ void escape_cursor(Row& r) const {
    r.e_col = r.e < r.e_end ? __ldg(esc_col + r.e) : kNoEscape;
  }

  __device__ __forceinline__ Row row(int n) const {
    Row r = row_planes(n);
    row_tables(r, n);
    return r;
  }

  __device__ __forceinline__ void next_escape(Row& r) const {
    ++r.e;
    r.e_col = r.e < r.e_end ? __ldg(esc_col + r.e) : kNoEscape;
  }

  // The raw bytes of one 32-column chunk of one row: lo 0..15, lo 16..31, codes (fetch), decoded
  // later (decode). raw_src gives their global addresses (for cp.async into shared memory).
  static constexpr int kRawWords = 3;
  struct Raw {
    uint4 u[kRawWords];
  };

  __device__ __forceinline__ bool raw_src(const Row& r, int c, bool /*full*/, const uint4* (&p)[kRawWords]) const {
    p[0] = r.lo + 2 * c;
    p[1] = r.lo + 2 * c + 1;
    p[2] = r.codes + c;
    return true;
  }

  __device__ __forceinline__ void fetch(const Row& r, int c, bool full, Raw& raw) const {
    const uint4* p[kRawWords];
    raw_src(r, c, full, p);
#pragma unroll
    for (int i = 0; i < kRawWords; ++i) raw.u[i] = __ldcs(p[i]);
  }

  // All 32 columns decode even past K (padding is lo = 0, code = 0); the caller skips k >= K.
  // Chunks of one row must be decoded in ascending c (the escape cursor only moves forward).
  __device__ __forceinline__ void decode(Row& r, int c, bool /*full*/, int /*K*/, const Raw& raw,
                                         uint32_t (&w)[16]) const {
    const uint4 l0 = raw.u[0], l1 = raw.u[1], cw = raw.u[2];
    decode8(cw.x, l0.x, l0.y, r.base4, &w[0]);
    decode8(cw.y, l0.z, l0.w, r.base4, &w[4]);
    decode8(cw.z, l1.x, l1.y, r.base4, &w[8]);
    decode8(cw.w, l1.z, l1.w, r.base4, &w[12]);
    const int col0 = c * kChunk;
    // Escapes in place (rare). Each lane moves its own cursor past other lanes' chunks, then walks
    // the 32 columns with compile-time indices (a computed index would put w in local memory).
    while (r.e_col < col0) next_escape(r);
    if (r.e_col < col0 + kChunk) {
#pragma unroll
      for (int j = 0; j < kChunk; ++j) {
        if (r.e_col == col0 + j) {
          const uint32_t v = (uint32_t)__ldg(esc_val + r.e);
          w[j / 2] = (j & 1) ? ((w[j / 2] & 0x0000FFFFu) | (v << 16)) : ((w[j / 2] & 0xFFFF0000u) | v);
          next_escape(r);
        }
      }
    }
  }

  __device__ __forceinline__ void load_chunk(Row& r, int c, bool full, int K, uint32_t (&w)[16]) const {
    Raw raw;
    fetch(r, c, full, raw);
    decode(r, c, full, K, raw, w);
  }
};

struct Bf16Source {
  const uint16_t* w;
  int K;
  bool vec;  // rows 16-byte aligned (K % 8 == 0 and w aligned)

  struct Row {
    const uint16_t* w;
  };

  __device__ __forceinline__ Row row(int n) const { return Row{w + (int64_t)n * K}; }
  __device__ __forceinline__ Row row_planes(int n) const { return row(n); }
  __device__ __forceinline__ void row_tables(Row&, int) const {}
  __device__ __forceinline__ void row_bounds(Row&, int) const {}
  __device__ __forceinline__ void escape_cursor(Row&) const {}

  static constexpr int kRawWords = 4;
  struct Raw {
    uint4 u[kRawWords];
  };

  // Vector loads for full chunks of 16-byte aligned rows only (false: decode loads the chunk itself).
  __device__ __forceinline__ bool raw_src(const Row& r, int c, bool full, const uint4* (&p)[kRawWords]) const {
    if (!(full && vec)) return false;
#pragma unroll
    for (int i = 0; i < kRawWords; ++i) p[i] = reinterpret_cast<const uint4*>(r.w + c * kChunk) + i;
    return true;
  }

  __device__ __forceinline__ void fetch(const Row& r, int c, bool full, Raw& raw) const {
    const uint4* p[kRawWords];
    if (raw_src(r, c, full, p)) {
#pragma unroll
      for (int i = 0; i < kRawWords; ++i) raw.u[i] = __ldcs(p[i]);
    }
  }

  __device__ __forceinline__ void decode(Row& r, int c, bool full, int Kc, const Raw& raw, uint32_t (&out)[16]) const {
    const int col0 = c * kChunk;
    if (full && vec) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        out[4 * i + 0] = raw.u[i].x;
        out[4 * i + 1] = raw.u[i].y;
        out[4 * i + 2] = raw.u[i].z;
        out[4 * i + 3] = raw.u[i].w;
      }
    } else {  // tail chunk or unaligned rows: 2-byte loads, columns >= K read as 0 (never added)
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const int k = col0 + 2 * i;
        const uint32_t a = k < Kc ? (uint32_t)__ldg(r.w + k) : 0u;
        const uint32_t b = k + 1 < Kc ? (uint32_t)__ldg(r.w + k + 1) : 0u;
        out[i] = a | (b << 16);
      }
    }
  }

  __device__ __forceinline__ void load_chunk(Row& r, int c, bool full, int Kc, uint32_t (&out)[16]) const {
    Raw raw;
    fetch(r, c, full, raw);
    decode(r, c, full, Kc, raw, out);
  }
};

// ---- one decoded chunk (32 columns of R rows) into the lanes' fmaf chains, columns ascending ----

template <int MT, int R>
__device__ __forceinline__ void accumulate_chunk(const uint32_t (&w)[R][16], const uint16_t* __restrict__ x, int M,
                                                 int K, int col0, bool full, bool xvec, float (&acc)[R][MT]) {
  if (full && xvec) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {  // 8 columns at a time, ascending
      float wf[R][8];
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          wf[r][2 * i] = lo_half_to_float(w[r][4 * q + i]);
          wf[r][2 * i + 1] = hi_half_to_float(w[r][4 * q + i]);
        }
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        if (m < M) {
          const uint4 xv = __ldg(reinterpret_cast<const uint4*>(x + (int64_t)m * K + col0 + 8 * q));
          const float xf[8] = {lo_half_to_float(xv.x), hi_half_to_float(xv.x), lo_half_to_float(xv.y),
                               hi_half_to_float(xv.y), lo_half_to_float(xv.z), hi_half_to_float(xv.z),
                               lo_half_to_float(xv.w), hi_half_to_float(xv.w)};
#pragma unroll
          for (int r = 0; r < R; ++r)
#pragma unroll
            for (int j = 0; j < 8; ++j) acc[r][m] = __fmaf_rn(xf[j], wf[r][j], acc[r][m]);
        }
      }
    }
  } else {  // the tail chunk or unaligned x: column by column, k < K only (same order)
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      const int k = col0 + j;
      if (k < K) {
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          if (m < M) {
            const float xf = __uint_as_float((uint32_t)__ldg(x + (int64_t)m * K + k) << 16);
#pragma unroll
            for (int r = 0; r < R; ++r) {
              uint32_t pair = 0;
#pragma unroll
              for (int i = 0; i < 16; ++i)
                if ((j >> 1) == i) pair = w[r][i];
              const float wv = (j & 1) ? hi_half_to_float(pair) : lo_half_to_float(pair);
              acc[r][m] = __fmaf_rn(xf, wv, acc[r][m]);
            }
          }
        }
      }
    }
  }
}

// ---- the kernel body: one warp, rows row0 .. row0+R-1 (rows >= N computed on row N-1, not stored) ----
// U = chunks per lane fetched before the first is used (1 = the pre-tuning kernel, load then use).

template <class Source, int MT, int R, int U = 1>
__device__ __forceinline__ void linear_warp(const Source& src, const uint16_t* __restrict__ x, int M,
                                            uint16_t* __restrict__ y, int N, int K, int row0, bool xvec) {
  const int lane = threadIdx.x & 31;
  float acc[R][MT];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m) acc[r][m] = 0.0f;

  // U > 1: the first weight loads go out before the row's base / escape tables are read (their
  // dependent loads would otherwise delay them a full latency); U = 1 keeps the pre-tuning order.
  constexpr bool kTablesLate = U > 1;
  typename Source::Row rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int n = row0 + r < N ? row0 + r : N - 1;
    rows[r] = kTablesLate ? src.row_planes(n) : src.row(n);
  }

  const int nchunks = (K + kChunk - 1) / kChunk;
  for (int c0 = lane; c0 < nchunks; c0 += U * kLanes) {
    typename Source::Raw raw[U][R];  // [U chunks][R rows]: every load issued before any is used
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = c0 + u * kLanes;
      if (c < nchunks) {
#pragma unroll
        for (int r = 0; r < R; ++r) src.fetch(rows[r], c, c * kChunk + kChunk <= K, raw[u][r]);
      }
    }
    pdl_wait();  // weights are in flight; x may come from the previous kernel
    if (kTablesLate && c0 == lane) {
#pragma unroll
      for (int r = 0; r < R; ++r) src.row_tables(rows[r], row0 + r < N ? row0 + r : N - 1);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {  // chunks c0, c0+32, ... ascending: the lane's chain order
      const int c = c0 + u * kLanes;
      if (c < nchunks) {
        const int col0 = c * kChunk;
        const bool full = col0 + kChunk <= K;
        uint32_t w[R][16];  // 32 columns per row as bf16x2 (low half = even column)
#pragma unroll
        for (int r = 0; r < R; ++r) src.decode(rows[r], c, full, K, raw[u][r], w[r]);
        accumulate_chunk<MT, R>(w, x, M, K, col0, full, xvec, acc);
      }
    }
  }

  pdl_wait();  // lanes without chunks too: y may still be the previous kernel's to write

  // The fixed tree over lanes; every lane ends with the same sums.
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int off = kLanes / 2; off >= 1; off /= 2) acc[r][m] = acc[r][m] + __shfl_xor_sync(0xFFFFFFFFu, acc[r][m], off);

#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m)
      if (m < M && row0 + r < N && lane == ((r * MT + m) & 31))
        y[(int64_t)m * N + row0 + r] = f32_bits_to_bf16_rne(__float_as_uint(acc[r][m]));
}

}  // namespace split12
}  // namespace specpilot
