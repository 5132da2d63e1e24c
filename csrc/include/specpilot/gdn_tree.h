// Launchers of the Gated DeltaNet kernels over a draft tree (engine/tree/layout.py): nodes in
// topological order (every parent before its children), each continuing its parent's sequence, not
// the previous node's. Torch-free, as specpilot/gdn.h: bf16 as uint16 bit patterns, the stream as a
// cudaStream_t in a void*, a cudaError_t returned as int (0 = success). The bindings
// (csrc/bindings/gdn_tree_cuda.cpp) check shapes, dtypes and devices first.
#pragma once

#include <cstdint>

namespace specpilot {
namespace gdn {

constexpr int kMaxTreeNodes = 64;  // nodes of one tree (the per-node states the cache keeps)

// The recurrence (csrc/cuda/gdn_chain.cu): as cuda_gdn_chain over `nodes` tokens, except that node i
// starts from the state after parents[i] (states_out[parents[i]]; -1: state_in) instead of after
// node i - 1. nodes <= kMaxTreeNodes. parents [nodes] int64 on the device, parents[i] in [-1, i); a parent outside that
// range gives NaN outputs and states for the node and its descendants. A chain-shaped tree
// (parents[i] = i - 1) runs the very instructions of cuda_gdn_chain: equal results, bit for bit.
int cuda_gdn_tree(const uint16_t* mixed, int64_t row_stride, int nk, int hv, int dk, int dv, const float* g,
                  const float* beta, const float* state_in, const int64_t* parents, float* states_out,
                  uint16_t* out, int nodes, float scale, void* stream);

// The short causal conv + SiLU over each node's ancestor window (csrc/cuda/gdn_tree_conv.cu).
// qkv [nodes, row_stride] bf16: the nodes' conv inputs in channels 0..channels-1. conv_state
// [channels, width - 1] bf16: the committed inputs, oldest first. weight [channels, width] bf16.
// window_index [nodes, width] int64: node i's window, oldest first, as indices into the extended
// sequence [the width - 1 committed inputs, the nodes' inputs] (TreeLayout.conv_window_index);
// an index outside it reads as NaN. Writes windows [nodes, width, channels] bf16 (node i's window:
// the torch reference's [channels, nodes, width] tensor, transposed) and out [nodes, channels] bf16:
// silu(sum_k weight[c][k] window[k]) with the sum in fp32 over k = 0..width-1, rounded to bf16 before
// the SiLU and after it (as the bf16 torch conv1d then silu).
int cuda_gdn_tree_conv(const uint16_t* qkv, int64_t row_stride, const uint16_t* conv_state, const uint16_t* weight,
                       const int64_t* window_index, uint16_t* windows, uint16_t* out, int nodes, int channels,
                       int width, void* stream);

}  // namespace gdn
}  // namespace specpilot
