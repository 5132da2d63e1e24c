// A self-contained copy of csrc/cuda/skinny_gemm.cu's kernel with switches, for one-off experiments
// (compiled by NVRTC through CuPy; bench/probes/skinny_variants.py runs it). Not used by the
// package: it reproduces the sixth session's variant table in docs/PERF_NOTES.md.
//   WARPS      warps (16-row tiles) per CTA                      (shipped: 4)
//   MINB       __launch_bounds__ minimum CTAs per SM             (shipped: 1)
//   XPREFETCH  load the next span's x fragments one span ahead   (shipped: 0)
//   NOSTAGE    diagnostic: skip x's copies (zeros; wrong output) (shipped: 0)
#ifndef WARPS
#define WARPS 4
#endif
#ifndef MINB
#define MINB 1
#endif
#ifndef XPREFETCH
#define XPREFETCH 0
#endif
#ifndef NOSTAGE
#define NOSTAGE 0
#endif
#ifdef __CUDACC_RTC__
typedef unsigned int uint32_t;
typedef unsigned short uint16_t;
typedef long long int64_t;
#else
#include <cstdint>
#endif
constexpr int kWarps = WARPS, kThreads = WARPS * 32, kRowsPerCta = WARPS * 16;
constexpr int kSpan = 128, kStageCols = 512, kSpansPerStage = 4, kDepth = 2, kXRow = kStageCols + 32;

__device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t word(const uint4* v, int q) { return (&v[q / 4].x)[q % 4]; }
__device__ __forceinline__ uint16_t f2bf(float f) {  // RNE
  uint32_t u = __float_as_uint(f); u += 0x7FFFu + ((u >> 16) & 1u); return (uint16_t)(u >> 16);
}

template <int NT>
__device__ __forceinline__ void stage_x(const uint16_t* x, int m_rows, int K, int c0, int c_end, uint16_t* xs) {
  constexpr int kVecs = kStageCols / 8;
  for (int v = threadIdx.x; v < NT * 8 * kVecs; v += kThreads) {
    const int m = v / kVecs, c = (v % kVecs) * 8;
    const bool in = !NOSTAGE && m < m_rows && c0 + c < c_end;
    const uint16_t* src = in ? x + (int64_t)m * K + c0 + c : x;
    const uint32_t dst = (uint32_t)__cvta_generic_to_shared(xs + m * kXRow + c);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(in ? 16 : 0) : "memory");
  }
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int NT>
__device__ void body(const uint16_t* w, int N, int K, const uint16_t* x, int M, uint16_t* y, float* partials,
                     int* counters, int slice_cols) {
  extern __shared__ __align__(16) uint16_t xs[];
  __shared__ int is_last;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int k_begin = blockIdx.y * slice_cols, k_end = min(K, k_begin + slice_cols);
  const int spans = (k_end - k_begin + kSpan - 1) / kSpan;
  const int row0 = blockIdx.x * kRowsPerCta + warp * 16;
  const uint16_t* w_lo = w + (int64_t)min(row0 + g, N - 1) * K;
  const uint16_t* w_hi = w + (int64_t)min(row0 + g + 8, N - 1) * K;
  uint4 ring[kDepth][8];
  auto fetch = [&](int span, uint4 (&buf)[8]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int col = k_begin + span * kSpan + 32 * i + 8 * t;
      const bool in = span < spans && col < k_end;
      buf[i] = in ? __ldcs(reinterpret_cast<const uint4*>(w_lo + col)) : make_uint4(0u, 0u, 0u, 0u);
      buf[4 + i] = in ? __ldcs(reinterpret_cast<const uint4*>(w_hi + col)) : make_uint4(0u, 0u, 0u, 0u);
    }
  };
#pragma unroll
  for (int d = 0; d < kDepth; ++d) fetch(d, ring[d]);
  stage_x<NT>(x, M, K, k_begin, k_end, xs);
  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[j][i] = 0.0f;
  uint4 xn[NT][4];
  for (int s = 0; s < spans; s += kDepth) {
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      const int span = s + d;
      if (span >= spans) break;
      const int stage = span / kSpansPerStage;
      const uint16_t* buf = xs + (stage % 2) * (NT * 8 * kXRow);
      const int col = (span % kSpansPerStage) * kSpan + 8 * t;
      bool fresh = false;
      if (span % kSpansPerStage == 0) {
        asm volatile("cp.async.wait_group 0;\n" ::: "memory");
        __syncthreads();
        if ((stage + 1) * kSpansPerStage < spans)
          stage_x<NT>(x, M, K, k_begin + (stage + 1) * kStageCols, k_end, xs + ((stage + 1) % 2) * (NT * 8 * kXRow));
        fresh = true;
      }
      uint4 xv[NT][4];
      if (!XPREFETCH || fresh) {
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int i = 0; i < 4; ++i) xv[j][i] = *reinterpret_cast<const uint4*>(buf + (8 * j + g) * kXRow + col + 32 * i);
      } else {
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int i = 0; i < 4; ++i) xv[j][i] = xn[j][i];
      }
      if (XPREFETCH && (span + 1) % kSpansPerStage != 0) {  // next span, same stage
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int i = 0; i < 4; ++i) xn[j][i] = *reinterpret_cast<const uint4*>(buf + (8 * j + g) * kXRow + col + kSpan + 32 * i);
      }
      uint4 cur[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) cur[i] = ring[d][i];
      fetch(span + kDepth, ring[d]);
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int q = 0; q < 16; q += 2) {
          const uint32_t a[4] = {word(cur, q), word(cur + 4, q), word(cur, q + 1), word(cur + 4, q + 1)};
          mma(acc[j], a, word(xv[j], q), word(xv[j], q + 1));
        }
    }
  }
  const bool split = gridDim.y > 1;
  float* part = split ? partials + (int64_t)blockIdx.y * M * N : nullptr;
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int token = 8 * j + 2 * t + (i & 1), row = row0 + g + (i >= 2 ? 8 : 0);
      if (token >= M || row >= N) continue;
      if (split) part[(int64_t)token * N + row] = acc[j][i];
      else y[(int64_t)token * N + row] = f2bf(acc[j][i]);
    }
  if (!split) return;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(counters + blockIdx.x, 1) == (int)gridDim.y - 1;
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  const int rows = min(kRowsPerCta, N - (int)blockIdx.x * kRowsPerCta);
  for (int idx = threadIdx.x; idx < rows * M; idx += kThreads) {
    const int64_t at = (int64_t)(idx / rows) * N + blockIdx.x * kRowsPerCta + idx % rows;
    float sum = __ldcg(partials + at);
    for (int s = 1; s < (int)gridDim.y; ++s) sum += __ldcg(partials + (int64_t)s * M * N + at);
    y[at] = f2bf(sum);
  }
  if (threadIdx.x == 0) counters[blockIdx.x] = 0;
}

extern "C" __global__ void __launch_bounds__(kThreads, MINB) sk1(const uint16_t* w, int N, int K, const uint16_t* x, int M,
    uint16_t* y, float* p, int* c, int sc) { body<1>(w, N, K, x, M, y, p, c, sc); }
extern "C" __global__ void __launch_bounds__(kThreads, MINB) sk2(const uint16_t* w, int N, int K, const uint16_t* x, int M,
    uint16_t* y, float* p, int* c, int sc) { body<2>(w, N, K, x, M, y, p, c, sc); }
