// The Gated DeltaNet recurrence kernel for a chain of tokens (contract: specpilot/gdn.h) and for a
// draft tree of nodes (specpilot/gdn_tree.h): one kernel, a chain being the tree whose node t has
// parent t - 1, so a chain-shaped tree gives the chain's results bit for bit.
//
// One CTA per (value head, 32-column slice of the state), DK threads. The slice [DK rows][32 cols]
// lives in registers for the whole block: thread t holds 8 rows x 4 columns, columns 4 cg..4 cg + 3
// (cg = lane % 8) of rows rg + (DK / 8) j, j = 0..7 (rg = t / 8).
//
// Memory pattern of the per-token state snapshots (the dominant traffic: 2 MB per token per layer at
// 32 heads of 128 x 128): in global memory a row of the slice is 32 contiguous floats (128 B, one
// line), rows dv floats apart. Store j of a warp writes its 4 row groups' row j: 4 rows x 8 lanes x
// one float4 = 4 whole 128-byte lines, each lane's 16 bytes beside its neighbour's. So every store
// instruction fills whole lines (no partial sectors, 16 sector writes per 512 B), straight from the
// registers (no shared-memory staging, no extra barrier), and the reload of a parent's snapshot
// (trees) reads back exactly the elements the same thread wrote. The old layout (a thread per row,
// 32 columns) wrote 32 half-sectors per instruction, a row per lane 512 B apart.
//
// Everything that does not depend on the state runs before the serial loop, a chunk of kChunk tokens
// at a time: the q / k L2 norms (a warp per token), exp(g), beta, the value slice. The serial loop per
// token is then registers + shared memory only: the two column sums S^T k and S^T q reduce 4 values
// per thread (2 shuffles each, then the DK / 32 warps' partials through shared memory).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "specpilot/gdn.h"
#include "specpilot/gdn_tree.h"

namespace specpilot {
namespace gdn {
namespace {

constexpr int kCols = 32;   // state columns (value dims) per CTA
constexpr int kRows = 8;    // state rows per thread
constexpr int kChunk = 16;  // tokens whose inputs are prepared at once (shared memory)
constexpr int kBadParent = -2;  // a parent outside [-1, node)

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// The chunk's inputs, prepared: q (normalised, scaled) and k (normalised) per token, fp32.
template <int DK>
struct Prepared {
  float q[kChunk][DK];
  float k[kChunk][DK];
  float v[kChunk][kCols];
  float decay[kChunk];
  float beta[kChunk];
};

// Fills `in` with tokens t0..t0+n-1 (n <= kChunk). Called by the whole CTA, between barriers.
template <int DK>
__device__ __forceinline__ void prepare(Prepared<DK>& in, const __nv_bfloat16* __restrict__ mixed,
                                        int64_t row_stride, int key_head, int key_dim, int h, int hv, int dv, int c0,
                                        const float* __restrict__ g, const float* __restrict__ beta, int t0, int n,
                                        float scale) {
  constexpr int kWarps = DK / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  static_assert(kChunk % kWarps == 0, "a chunk's tokens split evenly over the warps");
  constexpr int kPerWarp = kChunk / kWarps;  // tokens per warp: its q and k norms
  float q[kPerWarp][DK / 32], k[kPerWarp][DK / 32];
#pragma unroll
  for (int i = 0; i < kPerWarp; ++i) {  // every load issued before the first is used: one round trip
    const int r = warp + i * kWarps;
    const __nv_bfloat16* row = mixed + (int64_t)(t0 + r) * row_stride;
#pragma unroll
    for (int m = 0; m < DK / 32; ++m) {
      q[i][m] = r < n ? __bfloat162float(row[key_head * DK + lane + 32 * m]) : 0.f;
      k[i][m] = r < n ? __bfloat162float(row[key_dim + key_head * DK + lane + 32 * m]) : 0.f;
    }
  }
#pragma unroll
  for (int i = 0; i < kPerWarp; ++i) {
    const int r = warp + i * kWarps;
    if (r >= n) break;  // uniform across the warp
    float qq = 0.f, kk = 0.f;
#pragma unroll
    for (int m = 0; m < DK / 32; ++m) {
      qq = fmaf(q[i][m], q[i][m], qq);
      kk = fmaf(k[i][m], k[i][m], kk);
    }
    const float q_factor = rsqrtf(warp_sum(qq) + 1e-6f) * scale, k_factor = rsqrtf(warp_sum(kk) + 1e-6f);
#pragma unroll
    for (int m = 0; m < DK / 32; ++m) {
      in.q[r][lane + 32 * m] = q[i][m] * q_factor;
      in.k[r][lane + 32 * m] = k[i][m] * k_factor;
    }
  }
  for (int e = threadIdx.x; e < n * kCols; e += DK) {
    const int r = e / kCols, c = e % kCols;
    in.v[r][c] = __bfloat162float(mixed[(int64_t)(t0 + r) * row_stride + 2 * key_dim + h * dv + c0 + c]);
  }
  if (threadIdx.x < n) {
    in.decay[threadIdx.x] = expf(g[(int64_t)(t0 + threadIdx.x) * hv + h]);
    in.beta[threadIdx.x] = beta[(int64_t)(t0 + threadIdx.x) * hv + h];
  }
}

// part (4 columns of this thread's 8 rows) -> the column total over all DK rows, for this thread's 4
// columns (every thread of a column group gets the same bits). red: [DK / 32][kCols] shared.
template <int DK>
__device__ __forceinline__ float4 column_total(float (&part)[4], float (*red)[kCols]) {
  constexpr int kWarps = DK / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    part[c] += __shfl_xor_sync(0xffffffffu, part[c], 8);  // the warp's 4 row groups of this column group
    part[c] += __shfl_xor_sync(0xffffffffu, part[c], 16);
  }
  if (lane < 8) *reinterpret_cast<float4*>(&red[warp][4 * lane]) = make_float4(part[0], part[1], part[2], part[3]);
  __syncthreads();
  float4 total = *reinterpret_cast<const float4*>(&red[0][4 * (lane % 8)]);
#pragma unroll
  for (int w = 1; w < kWarps; ++w) {
    const float4 x = *reinterpret_cast<const float4*>(&red[w][4 * (lane % 8)]);
    total.x += x.x;
    total.y += x.y;
    total.z += x.z;
    total.w += x.w;
  }
  return total;
}

// parents: nullptr for a chain (token t continues token t - 1), else node t's parent (-1: the
// committed state), parents[t] < t, tokens <= kMaxTreeNodes. A parent outside [-1, t) poisons that
// node's outputs (and its descendants') with NaN, reading nothing out of bounds.
template <int DK>
__global__ void __launch_bounds__(DK) gdn_recurrence_kernel(const __nv_bfloat16* __restrict__ mixed,
                                                            int64_t row_stride, int nk, int hv, int dv,
                                                            const float* __restrict__ g,
                                                            const float* __restrict__ beta,
                                                            const float* __restrict__ state_in,
                                                            const int64_t* __restrict__ parents, float* states_out,
                                                            __nv_bfloat16* __restrict__ out, int tokens,
                                                            float scale) {
  static_assert(DK % 32 == 0 && DK / 8 * kRows == DK, "DK threads of 8 rows x 4 columns cover DK x 32");
  __shared__ Prepared<DK> in;
  __shared__ __align__(16) float red_k[DK / 32][kCols];  // S^T k partials
  __shared__ __align__(16) float red_q[DK / 32][kCols];  // S^T q partials
  __shared__ int parent_of[kMaxTreeNodes];
  const int h = blockIdx.x, c0 = blockIdx.y * kCols, tid = threadIdx.x;
  const int key_head = h / (hv / nk), key_dim = nk * DK;
  const int lane = tid % 32, cg = lane % 8, rg = tid / 8;
  const int64_t state_size = (int64_t)hv * DK * dv;
  // offset of this thread's first element (row rg, column c0 + 4 cg) within one [hv, DK, dv] state
  const int64_t mine = (int64_t)h * DK * dv + (int64_t)rg * dv + c0 + 4 * cg;
  const int64_t row_step = (int64_t)(DK / 8) * dv;  // from row j to row j + 1 of this thread

  if (parents != nullptr) {
    for (int i = tid; i < tokens; i += DK) {
      const int64_t p = parents[i];
      parent_of[i] = p < -1 || p >= i ? kBadParent : (int)p;
    }
  }  // published by the first chunk's barriers
  auto parent = [&](int t) { return parents == nullptr ? t - 1 : parent_of[t]; };

  float s[kRows][4];    // the state slice after the current token
  float pre[kRows][4];  // the state the next token starts from when it does not continue this one
  auto fetch = [&](int p, float(&dst)[kRows][4]) {
    const float* src = p == -1 ? state_in : states_out + p * state_size;  // p: written by this thread
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      const float4 x = p == kBadParent ? make_float4(nanf(""), nanf(""), nanf(""), nanf(""))
                                       : *reinterpret_cast<const float4*>(src + mine + j * row_step);
      dst[j][0] = x.x;
      dst[j][1] = x.y;
      dst[j][2] = x.z;
      dst[j][3] = x.w;
    }
  };
  fetch(-1, s);
  fetch(kBadParent, pre);  // NaN: what node 0 starts from when its parent is bad

  for (int t0 = 0; t0 < tokens; t0 += kChunk) {
    const int n = min(kChunk, tokens - t0);
    __syncthreads();  // the previous chunk's inputs are read
    prepare<DK>(in, mixed, row_stride, key_head, key_dim, h, hv, dv, c0, g, beta, t0, n, scale);
    __syncthreads();
    for (int r = 0; r < n; ++r) {
      const int t = t0 + r;
      if (parent(t) != t - 1) {  // a branch: the parent's state, fetched during the previous token
#pragma unroll
        for (int j = 0; j < kRows; ++j)
#pragma unroll
          for (int c = 0; c < 4; ++c) s[j][c] = pre[j][c];
      }
      if (t + 1 < tokens && parent(t + 1) != t) fetch(parent(t + 1), pre);  // its latency hides behind token t
      float kr[kRows], qr[kRows];
#pragma unroll
      for (int j = 0; j < kRows; ++j) {
        kr[j] = in.k[r][rg + (DK / 8) * j];
        qr[j] = in.q[r][rg + (DK / 8) * j];
      }
      const float decay = in.decay[r], b = in.beta[r];
      float part[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int j = 0; j < kRows; ++j) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          s[j][c] *= decay;
          part[c] = fmaf(s[j][c], kr[j], part[c]);
        }
      }
      const float4 predicted = column_total<DK>(part, red_k);  // S^T k: what the state predicts for k
      const float u[4] = {b * (in.v[r][4 * cg] - predicted.x), b * (in.v[r][4 * cg + 1] - predicted.y),
                          b * (in.v[r][4 * cg + 2] - predicted.z), b * (in.v[r][4 * cg + 3] - predicted.w)};
#pragma unroll
      for (int c = 0; c < 4; ++c) part[c] = 0.f;
#pragma unroll
      for (int j = 0; j < kRows; ++j) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          s[j][c] = fmaf(kr[j], u[c], s[j][c]);
          part[c] = fmaf(s[j][c], qr[j], part[c]);
        }
      }
      float4 o = column_total<DK>(part, red_q);  // S^T q: the output
      // Reuse of red_k / red_q by the next token is safe without another barrier: every thread read
      // red_k before it reached column_total's barrier on red_q, and red_q before the next token's
      // barrier on red_k.
      if (rg == 0) {
        __nv_bfloat162* dst = reinterpret_cast<__nv_bfloat162*>(out + ((int64_t)t * hv + h) * dv + c0 + 4 * cg);
        dst[0] = __floats2bfloat162_rn(o.x, o.y);
        dst[1] = __floats2bfloat162_rn(o.z, o.w);
      }
      float* snapshot = states_out + t * state_size + mine;
#pragma unroll
      for (int j = 0; j < kRows; ++j) {
        *reinterpret_cast<float4*>(snapshot + j * row_step) = make_float4(s[j][0], s[j][1], s[j][2], s[j][3]);
      }
    }
  }
}

int launch(const uint16_t* mixed, int64_t row_stride, int nk, int hv, int dk, int dv, const float* g,
           const float* beta, const float* state_in, const int64_t* parents, float* states_out, uint16_t* out,
           int tokens, float scale, void* stream) {
  if (tokens < 1 || nk < 1 || hv % nk != 0 || dv % kCols != 0) return (int)cudaErrorInvalidValue;
  const dim3 grid(hv, dv / kCols);
  const auto* x = reinterpret_cast<const __nv_bfloat16*>(mixed);
  auto* y = reinterpret_cast<__nv_bfloat16*>(out);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (dk) {
    case 64:
      gdn_recurrence_kernel<64><<<grid, 64, 0, s>>>(x, row_stride, nk, hv, dv, g, beta, state_in, parents,
                                                    states_out, y, tokens, scale);
      break;
    case 128:
      gdn_recurrence_kernel<128><<<grid, 128, 0, s>>>(x, row_stride, nk, hv, dv, g, beta, state_in, parents,
                                                      states_out, y, tokens, scale);
      break;
    default:
      return (int)cudaErrorInvalidValue;
  }
  return (int)cudaGetLastError();
}

}  // namespace

int cuda_gdn_chain(const uint16_t* mixed, int64_t row_stride, int nk, int hv, int dk, int dv, const float* g,
                   const float* beta, const float* state_in, float* states_out, uint16_t* out, int tokens,
                   float scale, void* stream) {
  return launch(mixed, row_stride, nk, hv, dk, dv, g, beta, state_in, nullptr, states_out, out, tokens, scale,
                stream);
}

int cuda_gdn_tree(const uint16_t* mixed, int64_t row_stride, int nk, int hv, int dk, int dv, const float* g,
                  const float* beta, const float* state_in, const int64_t* parents, float* states_out,
                  uint16_t* out, int nodes, float scale, void* stream) {
  if (parents == nullptr || nodes > kMaxTreeNodes) return (int)cudaErrorInvalidValue;
  return launch(mixed, row_stride, nk, hv, dk, dv, g, beta, state_in, parents, states_out, out, nodes, scale,
                stream);
}

}  // namespace gdn
}  // namespace specpilot
