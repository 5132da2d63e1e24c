// Launcher of the Gated DeltaNet chain kernel (csrc/cuda/gdn_chain.cu): the gated delta rule over
// T tokens (T = 1: an AR step; T <= 64: a chain verify block) for every value head of one GDN layer,
// starting from the committed recurrent state and writing the state after every token (the
// per-position snapshots engine/recurrent_state.py commits from). Torch-free: bf16 travels as uint16
// bit patterns, the stream as a cudaStream_t in a void*; returns a cudaError_t as int (0 = success).
// The bindings (csrc/bindings/gdn_cuda.cpp) check shapes, dtypes and devices first.
//
// mixed [T, row_stride] bf16: per token the conv output [q (nk * dk); k (nk * dk); v (hv * dv)]
// (q and k per key head; value head h reads key head h / (hv / nk)). g [T, hv] fp32: log decay.
// beta [T, hv] fp32. state_in [hv, dk, dv] fp32. states_out [T, hv, dk, dv] fp32, out [T, hv, dv] bf16.
// dk in {64, 128}, dv a multiple of 32.
//
// Arithmetic (fp32 throughout, one bf16 rounding of the output): q, k L2-normalised (eps 1e-6 inside
// the root), q scaled by `scale`; per token S <- exp(g) S; u = beta (v - S^T k); S <- S + k u^T;
// o = S^T q. The reference is python/specpilot/models/gdn.py recurrent_gated_delta_rule on fp32
// inputs; only the summation order differs.
#pragma once

#include <cstdint>

namespace specpilot {
namespace gdn {

int cuda_gdn_chain(const uint16_t* mixed, int64_t row_stride, int nk, int hv, int dk, int dv, const float* g,
                   const float* beta, const float* state_in, float* states_out, uint16_t* out, int tokens,
                   float scale, void* stream);

}  // namespace gdn
}  // namespace specpilot
