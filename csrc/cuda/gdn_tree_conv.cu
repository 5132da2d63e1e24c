// The short causal conv + SiLU of a Gated DeltaNet layer over a draft tree (contract:
// specpilot/gdn_tree.h): each node's window is its ancestors' inputs (above the root: the committed
// conv state), gathered through TreeLayout.conv_window_index.
//
// A thread per (node, channel), channels fastest: the reads of the nodes' inputs qkv [node][c] and
// the writes of out [node][c] and windows [node][k][c] are contiguous across a warp. The committed
// state [c][k] and the weight [c][k] are small (C x width) and stay in L1/L2 across nodes.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "specpilot/gdn_tree.h"

namespace specpilot {
namespace gdn {
namespace {

constexpr int kMaxWidth = 8;
constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) gdn_tree_conv_kernel(const __nv_bfloat16* __restrict__ qkv,
                                                                 int64_t row_stride,
                                                                 const __nv_bfloat16* __restrict__ conv_state,
                                                                 const __nv_bfloat16* __restrict__ weight,
                                                                 const int64_t* __restrict__ window_index,
                                                                 __nv_bfloat16* __restrict__ windows,
                                                                 __nv_bfloat16* __restrict__ out, int nodes,
                                                                 int channels, int width) {
  const int c = blockIdx.x * kThreads + threadIdx.x, node = blockIdx.y;
  if (c >= channels) return;
  const int past = width - 1;
  float acc = 0.f;
  for (int k = 0; k < width; ++k) {
    const int64_t e = window_index[(int64_t)node * width + k];
    __nv_bfloat16 x;
    if (e >= 0 && e < past) {
      x = conv_state[(int64_t)c * past + e];
    } else if (e >= past && e < past + nodes) {
      x = qkv[(e - past) * row_stride + c];
    } else {
      x = __float2bfloat16(nanf(""));  // an index outside the extended sequence
    }
    windows[((int64_t)node * width + k) * channels + c] = x;
    acc = fmaf(__bfloat162float(weight[(int64_t)c * width + k]), __bfloat162float(x), acc);
  }
  const float y = __bfloat162float(__float2bfloat16(acc));  // the conv's bf16 output, then the SiLU
  out[(int64_t)node * channels + c] = __float2bfloat16(y / (1.f + expf(-y)));
}

}  // namespace

int cuda_gdn_tree_conv(const uint16_t* qkv, int64_t row_stride, const uint16_t* conv_state, const uint16_t* weight,
                       const int64_t* window_index, uint16_t* windows, uint16_t* out, int nodes, int channels,
                       int width, void* stream) {
  if (nodes < 1 || channels < 1 || width < 2 || width > kMaxWidth) return (int)cudaErrorInvalidValue;
  const dim3 grid((channels + kThreads - 1) / kThreads, nodes);
  gdn_tree_conv_kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      reinterpret_cast<const __nv_bfloat16*>(qkv), row_stride, reinterpret_cast<const __nv_bfloat16*>(conv_state),
      reinterpret_cast<const __nv_bfloat16*>(weight), window_index, reinterpret_cast<__nv_bfloat16*>(windows),
      reinterpret_cast<__nv_bfloat16*>(out), nodes, channels, width);
  return (int)cudaGetLastError();
}

}  // namespace gdn
}  // namespace specpilot
