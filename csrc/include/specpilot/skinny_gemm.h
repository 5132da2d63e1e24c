// Skinny bf16 GEMM for a few token rows (verify blocks, drafts): y[M, N] = x[M, K] . W[N, K]^T,
// M <= 16, on tensor cores (csrc/cuda/skinny_gemm.cu). No fused prologue: every CTA of a K slice
// would recompute it (a SiLU gate fused this way cost more than the separate kernel).
// Exactness: fp32 accumulation in one fixed order that depends on (N, K, splits), never on M or on
// which CTA finishes first (the split-K partials are summed in slice order by the last CTA of a
// row block, counted with one atomic per CTA), so a token's output is the same at any M and on
// every run. Not bit-identical to cuBLAS (another summation order).
// Workspace: `partials` (splits * M * N floats, skinny_partials_floats) and `counters` (one int per
// row block, skinny_counters; zero before the first call, every call leaves them zero). With one
// split neither is touched. Torch-free; returns a cudaError_t as int (0 = success).
#pragma once

#include <cstdint>

namespace specpilot {
namespace skinny {

constexpr int kMaxM = 16;
constexpr int kRowsPerCta = 64;  // 4 warps x 16 rows (the mma's M side)

struct SkinnyArgs {
  const uint16_t* w;  // [N, K] bf16, rows contiguous, 16-byte aligned, K % 8 == 0
  int n, k;
  const uint16_t* x;  // [M, K], contiguous, 16-byte aligned
  int m;              // 1..kMaxM
  uint16_t* y;        // [M, N]
  float* partials;    // split-K workspace (see above)
  int* counters;
  int splits;         // K slices; 0 = skinny_splits(n, k)
  bool pdl;           // launch with programmatic dependent launch
};

// The split count the launcher picks for N x K on this GPU (independent of M).
int skinny_splits(int n, int k);
// Workspace sizes for a launch with `splits` slices.
int64_t skinny_partials_floats(int splits, int m, int n);
int skinny_counters(int n);

int cuda_skinny_gemm(const SkinnyArgs& args, void* stream);

}  // namespace skinny
}  // namespace specpilot
