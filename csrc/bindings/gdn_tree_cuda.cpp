// Schemas and CUDA impls of the Gated DeltaNet tree ops (kernels: csrc/cuda/gdn_chain.cu and
// csrc/cuda/gdn_tree_conv.cu, contract: specpilot/gdn_tree.h). CUDA only: elsewhere
// python/specpilot/kernels/gdn_tree.py runs the torch reference (models/gdn_tree.py).
// Out-parameter style on torch's current stream (nothing allocated inside the ops).
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <cmath>
#include <vector>

#include "check.h"
#include "specpilot/gdn_tree.h"

namespace specpilot {
namespace gdn {
namespace {

void check_tree_tensor(const char* op, const char* name, const at::Tensor& t, const at::Device& device,
                       at::ScalarType dtype, const std::vector<int64_t>& shape) {
  SP_CHECK(t.device() == device, op, ": ", name, " is on ", t.device(), " but the first input is on ", device);
  SP_CHECK(t.scalar_type() == dtype, op, ": ", name, " must be ", c10::toString(dtype), ", got ", t.scalar_type());
  SP_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous");
  SP_CHECK(t.sizes().vec() == shape, op, ": ", name, " must have shape ", c10::IntArrayRef(shape), ", got ",
           t.sizes());
}

void gdn_tree_cuda(const at::Tensor& mixed, int64_t num_key_heads, int64_t key_head_dim, const at::Tensor& g,
                   const at::Tensor& beta, const at::Tensor& state, const at::Tensor& parents,
                   const at::Tensor& states_out, const at::Tensor& out) {
  const char* op = "gdn_tree";
  SP_CHECK(mixed.is_cuda(), op, ": mixed must be a CUDA tensor, got one on ", mixed.device());
  SP_CHECK(mixed.scalar_type() == at::kBFloat16, op, ": mixed must be bfloat16, got ", mixed.scalar_type());
  SP_CHECK(mixed.dim() == 2 && mixed.stride(1) == 1, op, ": mixed must be [nodes, channels] with unit channel "
           "stride, got shape ", mixed.sizes());
  SP_CHECK(key_head_dim == 64 || key_head_dim == 128, op, ": key_head_dim must be 64 or 128, got ",
           std::to_string(key_head_dim));
  SP_CHECK(state.dim() == 3, op, ": state must be [value heads, key_head_dim, value_head_dim], got shape ",
           state.sizes());
  const at::Device dev = mixed.device();
  const int64_t n = mixed.size(0), hv = state.size(0), dv = state.size(2), nk = num_key_heads;
  SP_CHECK(n >= 1 && n <= kMaxTreeNodes, op, ": a tree of 1..", std::to_string(kMaxTreeNodes),
           " nodes is needed, got ", std::to_string(n));
  SP_CHECK(nk >= 1 && hv % nk == 0, op, ": value heads ", std::to_string(hv), " must be a multiple of key heads ",
           std::to_string(nk));
  SP_CHECK(dv % 32 == 0, op, ": value_head_dim must be a multiple of 32, got ", std::to_string(dv));
  SP_CHECK(mixed.size(1) == 2 * nk * key_head_dim + hv * dv, op, ": mixed has ", std::to_string(mixed.size(1)),
           " channels, expected 2 * ", std::to_string(nk * key_head_dim), " + ", std::to_string(hv * dv));
  check_tree_tensor(op, "state", state, dev, at::kFloat, {hv, key_head_dim, dv});
  check_tree_tensor(op, "g", g, dev, at::kFloat, {n, hv});
  check_tree_tensor(op, "beta", beta, dev, at::kFloat, {n, hv});
  check_tree_tensor(op, "parents", parents, dev, at::kLong, {n});
  check_tree_tensor(op, "states_out", states_out, dev, at::kFloat, {n, hv, key_head_dim, dv});
  check_tree_tensor(op, "out", out, dev, at::kBFloat16, {n, hv, dv});
  const c10::cuda::CUDAGuard guard(dev);
  const int err = cuda_gdn_tree(reinterpret_cast<const uint16_t*>(mixed.data_ptr()), mixed.stride(0), (int)nk,
                                (int)hv, (int)key_head_dim, (int)dv, g.data_ptr<float>(), beta.data_ptr<float>(),
                                state.data_ptr<float>(), parents.data_ptr<int64_t>(), states_out.data_ptr<float>(),
                                reinterpret_cast<uint16_t*>(out.data_ptr()), (int)n,
                                1.0f / std::sqrt(static_cast<float>(key_head_dim)),
                                c10::cuda::getCurrentCUDAStream(dev.index()).stream());
  SP_CHECK(err == 0, op, ": CUDA launch failed: ", cudaGetErrorString(static_cast<cudaError_t>(err)));
}

void gdn_tree_conv_cuda(const at::Tensor& qkv, const at::Tensor& conv_state, const at::Tensor& weight,
                        const at::Tensor& window_index, const at::Tensor& windows, const at::Tensor& out) {
  const char* op = "gdn_tree_conv";
  SP_CHECK(qkv.is_cuda(), op, ": qkv must be a CUDA tensor, got one on ", qkv.device());
  SP_CHECK(qkv.scalar_type() == at::kBFloat16, op, ": qkv must be bfloat16, got ", qkv.scalar_type());
  SP_CHECK(qkv.dim() == 2 && qkv.stride(1) == 1, op, ": qkv must be [nodes, channels] with unit channel stride, "
           "got shape ", qkv.sizes());
  SP_CHECK(weight.dim() == 2, op, ": weight must be [channels, width], got shape ", weight.sizes());
  const at::Device dev = qkv.device();
  const int64_t n = qkv.size(0), c = qkv.size(1), width = weight.size(1);
  SP_CHECK(n >= 1 && n <= kMaxTreeNodes, op, ": a tree of 1..", std::to_string(kMaxTreeNodes),
           " nodes is needed, got ", std::to_string(n));
  SP_CHECK(width >= 2 && width <= 8, op, ": the conv width must be 2..8, got ", std::to_string(width));
  check_tree_tensor(op, "weight", weight, dev, at::kBFloat16, {c, width});
  check_tree_tensor(op, "conv_state", conv_state, dev, at::kBFloat16, {c, width - 1});
  check_tree_tensor(op, "window_index", window_index, dev, at::kLong, {n, width});
  check_tree_tensor(op, "windows", windows, dev, at::kBFloat16, {n, width, c});
  check_tree_tensor(op, "out", out, dev, at::kBFloat16, {n, c});
  const c10::cuda::CUDAGuard guard(dev);
  const int err = cuda_gdn_tree_conv(reinterpret_cast<const uint16_t*>(qkv.data_ptr()), qkv.stride(0),
                                     reinterpret_cast<const uint16_t*>(conv_state.data_ptr()),
                                     reinterpret_cast<const uint16_t*>(weight.data_ptr()),
                                     window_index.data_ptr<int64_t>(), reinterpret_cast<uint16_t*>(windows.data_ptr()),
                                     reinterpret_cast<uint16_t*>(out.data_ptr()), (int)n, (int)c, (int)width,
                                     c10::cuda::getCurrentCUDAStream(dev.index()).stream());
  SP_CHECK(err == 0, op, ": CUDA launch failed: ", cudaGetErrorString(static_cast<cudaError_t>(err)));
}

}  // namespace
}  // namespace gdn
}  // namespace specpilot

TORCH_LIBRARY_FRAGMENT(specpilot, m) {
  m.def("gdn_tree(Tensor mixed, int num_key_heads, int key_head_dim, Tensor g, Tensor beta, Tensor state, "
        "Tensor parents, Tensor(a!) states_out, Tensor(b!) out) -> ()");
  m.def("gdn_tree_conv(Tensor qkv, Tensor conv_state, Tensor weight, Tensor window_index, Tensor(a!) windows, "
        "Tensor(b!) out) -> ()");
}

TORCH_LIBRARY_IMPL(specpilot, CUDA, m) {
  m.impl("gdn_tree", &specpilot::gdn::gdn_tree_cuda);
  m.impl("gdn_tree_conv", &specpilot::gdn::gdn_tree_conv_cuda);
}
