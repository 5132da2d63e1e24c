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

#include "specpilot/split12_format.h"

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

// The same product for split12 weights (format v1, csrc/cuda/split12_skinny.cu): bit-identical to
// cuda_skinny_gemm on the unpacked bf16 weights with the same ctas (same tiles, cuts and order),
// and the same workspace.
struct Split12SkinnyArgs {
  split12::Split12Planes planes;  // rows of kpad = round_up_kpad(k) columns, 16-byte aligned planes
  int n, k;                       // K % 8 == 0
  const uint16_t* x;
  int m;
  uint16_t* y;
  float* partials;
  int* counters;
  int ctas;
  bool pdl;
};

int cuda_split12_skinny_gemm(const Split12SkinnyArgs& args, void* stream);

}  // namespace skinny
}  // namespace specpilot
