// Tensor-core linear (mma.sync m16n8k16 bf16 -> fp32) for split12 and its bf16 twin, M = 1..32.
// Swap-AB: weights are the MMA's M side (16 rows per warp tile), tokens its N side (8 per tile).
//
// Exactness: split12 and bf16 twin outputs are bit-identical (same fragments, same mma sequence,
// same fixed cross-warp sum), and a token's output does not depend on M (each mma output element
// is its own dot product, the k order is independent of M). The order is NOT the CUDA-core /
// CPU order of split12_format.h (the mma adds 16 products its own way): against the fp64
// reference it stays within fp32 accumulation error.
//
// Work split: a block of kWarps warps owns 16 rows; warp w takes the 128-column spans w, w+kWarps,
// ...; in a span, lane (g = lane/4, t = lane%4) loads 32-column chunk 4*span+t of rows g and g+8
// (the same 16-byte loads and decode as the CUDA-core kernel) and x of token g (+8j) at the same
// columns. MMA k-slots {2t, 2t+1, 2t+8, 2t+9} of k-step s hold that lane's columns 4s..4s+3 for
// A and B alike, so no data moves between lanes. Columns >= K are zero in A and B.
#include <cuda_runtime.h>

#include "split12_kernel.cuh"

namespace specpilot {
namespace split12 {
namespace {

constexpr int kWarps = 8;
constexpr int kTileRows = 16;

__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Zero the columns >= K of a 32-column chunk held as 16 bf16x2 words.
__device__ __forceinline__ void zero_past_k(uint32_t (&w)[16], int col0, int K) {
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int k = col0 + 2 * i;
    if (k >= K) w[i] = 0u;
    else if (k + 1 >= K) w[i] &= 0x0000FFFFu;
  }
}

// x of one token at one 32-column chunk as 16 bf16x2 words (zeros past K or for absent tokens).
__device__ __forceinline__ void load_x(const uint16_t* x, int token, int M, int K, int col0, bool fast,
                                       uint32_t (&xw)[16]) {
  if (token >= M) {  // padding tokens of the 8-wide tile
#pragma unroll
    for (int i = 0; i < 16; ++i) xw[i] = 0u;
  } else if (fast) {
    const uint4* p = reinterpret_cast<const uint4*>(x + (int64_t)token * K + col0);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint4 v = __ldg(p + i);
      xw[4 * i] = v.x;
      xw[4 * i + 1] = v.y;
      xw[4 * i + 2] = v.z;
      xw[4 * i + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int k = col0 + 2 * i;
      const uint16_t* row = x + (int64_t)token * K;
      const uint32_t a = k < K ? (uint32_t)__ldg(row + k) : 0u;
      const uint32_t b = k + 1 < K ? (uint32_t)__ldg(row + k + 1) : 0u;
      xw[i] = a | (b << 16);
    }
  }
}

// One span in flight per warp, loads then use (a cp.async ring of 3-4 spans measured no faster).
template <class Source, int NT>  // NT token tiles of 8: M <= 8 * NT
__global__ void __launch_bounds__(kWarps * 32) tc_linear_kernel(Source src, const uint16_t* x, int M, uint16_t* y,
                                                                int N, int K, bool xvec) {
  __shared__ float partial[kWarps][NT * 8][kTileRows];  // per warp: [token][row]
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int row0 = blockIdx.x * kTileRows;
  typename Source::Row rows[2];
  rows[0] = src.row(row0 + g < N ? row0 + g : N - 1);
  rows[1] = src.row(row0 + g + 8 < N ? row0 + g + 8 : N - 1);

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[j][i] = 0.0f;

  const int nchunks = (K + kChunk - 1) / kChunk;
  const int nspans = (nchunks + 3) / 4;
  for (int s = warp; s < nspans; s += kWarps) {  // warp-uniform: every lane reaches every mma
    const int c = 4 * s + t;
    const bool live = c < nchunks;
    const int col0 = c * kChunk;
    const bool full = col0 + kChunk <= K;
    uint32_t wa[16], wb[16];  // rows g and g+8
    if (live) {
      src.load_chunk(rows[0], c, full, K, wa);
      src.load_chunk(rows[1], c, full, K, wb);
      if (!full) {
        zero_past_k(wa, col0, K);
        zero_past_k(wb, col0, K);
      }
    } else {
#pragma unroll
      for (int i = 0; i < 16; ++i) wa[i] = wb[i] = 0u;
    }
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      uint32_t xw[16];
      if (live) {
        load_x(x, 8 * j + g, M, K, col0, full && xvec, xw);
      } else {
#pragma unroll
        for (int i = 0; i < 16; ++i) xw[i] = 0u;
      }
      __syncwarp();  // mma.sync.aligned: the whole warp, converged
#pragma unroll
      for (int ks = 0; ks < 8; ++ks)  // k-step ks: this lane's columns 4ks .. 4ks+3 of the chunk
        mma_bf16(acc[j], wa[2 * ks], wb[2 * ks], wa[2 * ks + 1], wb[2 * ks + 1], xw[2 * ks], xw[2 * ks + 1]);
    }
  }

  // C fragment: c0/c1 = row g, tokens 2t/2t+1 of the tile; c2/c3 = row g+8.
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    partial[warp][8 * j + 2 * t][g] = acc[j][0];
    partial[warp][8 * j + 2 * t + 1][g] = acc[j][1];
    partial[warp][8 * j + 2 * t][g + 8] = acc[j][2];
    partial[warp][8 * j + 2 * t + 1][g + 8] = acc[j][3];
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < kTileRows * M; idx += kWarps * 32) {
    const int r = idx % kTileRows, n = idx / kTileRows;
    if (row0 + r >= N) continue;
    float sum = partial[0][n][r];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) sum = sum + partial[w][n][r];  // fixed order over warps
    y[(int64_t)n * N + row0 + r] = f32_bits_to_bf16_rne(__float_as_uint(sum));
  }
}

template <class Source>
int launch_tc(const Source& src, const uint16_t* x, int M, uint16_t* y, int N, int K, cudaStream_t stream) {
  const bool xvec = (K % 8 == 0) && ((reinterpret_cast<uintptr_t>(x) & 15u) == 0);
  const int blocks = (N + kTileRows - 1) / kTileRows;
  if (M <= 8) tc_linear_kernel<Source, 1><<<blocks, kWarps * 32, 0, stream>>>(src, x, M, y, N, K, xvec);
  else if (M <= 16) tc_linear_kernel<Source, 2><<<blocks, kWarps * 32, 0, stream>>>(src, x, M, y, N, K, xvec);
  else tc_linear_kernel<Source, 4><<<blocks, kWarps * 32, 0, stream>>>(src, x, M, y, N, K, xvec);
  return (int)cudaGetLastError();
}

}  // namespace

int cuda_split12_linear_tc(const uint16_t* x, int M, const uint8_t* lo, const uint8_t* codes, const uint8_t* base,
                           const int32_t* esc_rowptr, const int32_t* esc_col, const int16_t* esc_val, int N, int K,
                           uint16_t* y, void* stream) {
  if (M < 1 || M > kCudaMaxM || N < 1 || K < 1) return (int)cudaErrorInvalidValue;
  const Split12Source src{{lo, codes, base, esc_rowptr, esc_col, reinterpret_cast<const uint16_t*>(esc_val)},
                          (int)round_up_kpad(K)};
  return launch_tc(src, x, M, y, N, K, static_cast<cudaStream_t>(stream));
}

int cuda_bf16_linear_tc(const uint16_t* x, int M, const uint16_t* w, int N, int K, uint16_t* y, void* stream) {
  if (M < 1 || M > kCudaMaxM || N < 1 || K < 1) return (int)cudaErrorInvalidValue;
  const bool wvec = (K % 8 == 0) && ((reinterpret_cast<uintptr_t>(w) & 15u) == 0);
  const Bf16Source src{w, K, wvec};
  return launch_tc(src, x, M, y, N, K, static_cast<cudaStream_t>(stream));
}

}  // namespace split12
}  // namespace specpilot
