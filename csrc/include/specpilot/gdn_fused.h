// Launchers of the Gated DeltaNet layer's fused small ops (csrc/cuda/gdn_fused.cu), around the chain
// kernel (specpilot/gdn.h) on the decode / verify path of one sequence. Torch-free: bf16 travels as
// uint16 bit patterns, the stream as a cudaStream_t in a void*; returns a cudaError_t as int
// (0 = success). The bindings (csrc/bindings/gdn_fused_cuda.cpp) check shapes, dtypes and devices.
//
// Prologue, one launch: the causal conv update, SiLU and the gates of T tokens.
//   qkv [T, C] bf16 (row stride qkv_stride): the projection's conv inputs; b_in, a_in [T, hv] bf16
//   (row strides b_stride, a_stride); conv_state [C, K-1] bf16: the committed K-1 previous inputs;
//   conv_weight [C, K] bf16; a_log, dt_bias [hv], each fp32 or bf16 (the *_bf16 flags say which).
//   Writes window [C, K-1+T] bf16 = [conv_state | qkv^T] (the record a verify commit reads its K-1
//   inputs ending at any position from), mixed [T, C] bf16 = bf16(silu(bf16(conv))) with
//   conv[t, c] = sum_j w[c, j] window[c, t + j] accumulated in fp32, beta [T, hv] fp32 =
//   bf16(sigmoid(b)), g [T, hv] fp32 = -exp(a_log) * softplus(a + dt_bias) (softplus threshold 20).
//   K in {2, 3, 4}. The roundings are the torch path's (models/hybrid.py, models/gdn.py causal_conv).
//
// Gated RMSNorm epilogue: for each row r < rows and head h < heads, over the dv values of that head,
//   out = bf16(p * silu(z)) with p = w * bf16(x * rsqrt(mean(x^2) + eps)), statistics and silu in fp32
//   (w bf16: p is rounded to bf16, as torch's bf16 * bf16 product; w fp32: p stays fp32).
//   x [rows, heads * dv] bf16 (row stride x_stride), z likewise (z_stride), out [rows, heads * dv]
//   bf16 contiguous. models/gdn.py gated_rms_norm is the reference.
#pragma once

#include <cstdint>

namespace specpilot {
namespace gdn {

int cuda_gdn_prologue(const uint16_t* qkv, int64_t qkv_stride, const uint16_t* b_in, int64_t b_stride,
                      const uint16_t* a_in, int64_t a_stride, const uint16_t* conv_state, const uint16_t* conv_weight,
                      const void* a_log, bool a_log_bf16, const void* dt_bias, bool dt_bias_bf16, int channels,
                      int width, int hv, int tokens, uint16_t* window, uint16_t* mixed, float* g, float* beta,
                      void* stream);

int cuda_gdn_gated_norm(const uint16_t* x, int64_t x_stride, const uint16_t* z, int64_t z_stride, const void* weight,
                        bool weight_bf16, int rows, int heads, int dv, float eps, uint16_t* out, void* stream);

}  // namespace gdn
}  // namespace specpilot
