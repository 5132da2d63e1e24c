// One-token bf16 GEMV with its input's elementwise prologue fused in (csrc/cuda/gemv_m1.cu):
// y[N] = W[N, K] . in[K], where `in` is computed by every CTA into shared memory from
//   kGemvPlain    in = x[K]
//   kGemvAddNorm  s = bf16(x + delta) (delta optional), in = bf16(bf16(s * rstd) * norm_w),
//                 rstd = rsqrt(mean(s^2) + eps): add_rms_norm's arithmetic and summation order, so
//                 `in` is bit-identical to add_rms_norm's `normed`; CTA 0 also writes s to sum_out
//   kGemvSiluMul  in = bf16(bf16(silu(g)) * u) with x = [g | u], 2K values: silu_mul's arithmetic
// so the AR step of a decoder layer needs no separate norm or SwiGLU-gate kernel. Weights stream
// with evict-first 16-byte loads; with PDL the first loads are issued before the kernel waits for
// the previous one (weights never depend on it). fp32 accumulation, one fixed order: lane l of a
// warp takes the 8-column chunks l, l + 32, ... of its rows, then a butterfly over the lanes.
// Torch-free; returns a cudaError_t as int (0 = success).
#pragma once

#include <cstdint>

namespace specpilot {
namespace gemv {

enum GemvPrologue : int { kGemvPlain = 0, kGemvAddNorm = 1, kGemvSiluMul = 2 };

constexpr int kMaxNormHidden = 4096;  // add_rms_norm's order needs its block (<= 256 threads) in one CTA
constexpr int kMaxK = 16384;          // `in` lives in shared memory (32 KB)

struct GemvArgs {
  const uint16_t* w;       // [N, K] bf16, rows contiguous, 16-byte aligned, K % 8 == 0
  int n, k;
  int prologue;            // GemvPrologue
  const uint16_t* x;       // [K] (plain, add-norm) or [2K] (silu-mul)
  const uint16_t* delta;   // add-norm: [K] or nullptr
  const uint16_t* norm_w;  // add-norm: [K]
  float eps;
  uint16_t* sum_out;       // add-norm with delta: [K] (nullptr: not stored)
  uint16_t* y;             // [N]
  bool pdl;                // launch with programmatic dependent launch
};

int cuda_gemv_m1(const GemvArgs& args, void* stream);

}  // namespace gemv
}  // namespace specpilot
