// Skinny bf16 GEMM for a few token rows (verify blocks, drafts): y[M, N] = x[M, K] . W[N, K]^T,
// M <= 16, on Hopper tensor cores (csrc/cuda/skinny_gemm.cu). No fused prologue: every CTA of a
// row block would recompute it (a SiLU gate fused that way cost more than the separate kernel).
// Exactness: fp32 accumulation in one fixed order that depends on (N, K, ctas), never on M or on
// which CTA finishes first (a row block's K segments are summed in K order by the last CTA to
// finish one, counted with one atomic per segment), so a token's output is the same at any M and
// on every run. Not bit-identical to cuBLAS (another summation order).
// Workspace: `partials` (skinny_partials_floats) and `counters` (one int per row block,
// skinny_counters; zero before the first call, every call leaves them zero). Needs sm_90a and the
// driver's tensor-map encoder. Torch-free; returns a cudaError_t as int (0 = success).
#pragma once

#include <cstdint>

namespace specpilot {
namespace skinny {

constexpr int kMaxM = 16;         // the wgmma's N side (x rows past M are zero)
constexpr int kRowsPerCta = 64;   // weight rows per tile: the wgmma's M
constexpr int kBlockK = 64;       // K per TMA box: one 128-byte swizzle row

struct SkinnyArgs {
  const uint16_t* w;  // [N, K] bf16, rows contiguous, 16-byte aligned, K % 8 == 0
  int n, k;
  const uint16_t* x;  // [M, K], contiguous, 16-byte aligned
  int m;              // 1..kMaxM
  uint16_t* y;        // [M, N]
  float* partials;    // K-segment workspace (see above)
  int* counters;
  int ctas;           // persistent grid size; 0 = skinny_ctas(n, k)
  bool pdl;           // launch with programmatic dependent launch
};

// The grid the launcher uses for N x K on this GPU (persistent CTAs, at most one per SM).
int skinny_ctas(int n, int k);
// Workspace sizes for a launch over `ctas` CTAs (independent of M).
int64_t skinny_partials_floats(int ctas, int n);
int skinny_counters(int n);

int cuda_skinny_gemm(const SkinnyArgs& args, void* stream);

}  // namespace skinny
}  // namespace specpilot
