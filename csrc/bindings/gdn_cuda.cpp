// Schema and CUDA impl of the Gated DeltaNet chain op (kernel: csrc/cuda/gdn_chain.cu, contract:
// specpilot/gdn.h). CUDA only: elsewhere python/specpilot/kernels/gdn_chain.py runs the torch
// reference. Out-parameter style on torch's current stream (nothing allocated inside the op).
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <cmath>
#include <vector>

#include "check.h"
#include "specpilot/gdn.h"

namespace specpilot {
namespace gdn {
namespace {

void check_tensor(const char* name, const at::Tensor& t, const at::Device& device, at::ScalarType dtype,
                  const std::vector<int64_t>& shape) {
  const char* op = "gdn_chain";
  SP_CHECK(t.device() == device, op, ": ", name, " is on ", t.device(), " but mixed is on ", device);
  SP_CHECK(t.scalar_type() == dtype, op, ": ", name, " must be ", c10::toString(dtype), ", got ", t.scalar_type());
  SP_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous");
  SP_CHECK(t.sizes().vec() == shape, op, ": ", name, " must have shape ", c10::IntArrayRef(shape), ", got ",
           t.sizes());
}

void gdn_chain_cuda(const at::Tensor& mixed, int64_t num_key_heads, int64_t key_head_dim, const at::Tensor& g,
                    const at::Tensor& beta, const at::Tensor& state, const at::Tensor& states_out,
                    const at::Tensor& out) {
  const char* op = "gdn_chain";
  SP_CHECK(mixed.is_cuda(), op, ": mixed must be a CUDA tensor, got one on ", mixed.device());
  SP_CHECK(mixed.scalar_type() == at::kBFloat16, op, ": mixed must be bfloat16, got ", mixed.scalar_type());
  SP_CHECK(mixed.dim() == 2 && mixed.stride(1) == 1, op, ": mixed must be [T, channels] with unit channel stride, "
           "got shape ", mixed.sizes());
  SP_CHECK(key_head_dim == 64 || key_head_dim == 128, op, ": key_head_dim must be 64 or 128, got ",
           std::to_string(key_head_dim));
  SP_CHECK(state.dim() == 3, op, ": state must be [value heads, key_head_dim, value_head_dim], got shape ",
           state.sizes());
  const at::Device dev = mixed.device();
  const int64_t t = mixed.size(0), hv = state.size(0), dv = state.size(2), nk = num_key_heads;
  SP_CHECK(t >= 1, op, ": at least one token is needed");
  SP_CHECK(nk >= 1 && hv % nk == 0, op, ": value heads ", std::to_string(hv), " must be a multiple of key heads ",
           std::to_string(nk));
  SP_CHECK(dv % 32 == 0, op, ": value_head_dim must be a multiple of 32, got ", std::to_string(dv));
  SP_CHECK(mixed.size(1) == 2 * nk * key_head_dim + hv * dv, op, ": mixed has ", std::to_string(mixed.size(1)),
           " channels, expected 2 * ", std::to_string(nk * key_head_dim), " + ", std::to_string(hv * dv));
  check_tensor("state", state, dev, at::kFloat, {hv, key_head_dim, dv});
  check_tensor("g", g, dev, at::kFloat, {t, hv});
  check_tensor("beta", beta, dev, at::kFloat, {t, hv});
  check_tensor("states_out", states_out, dev, at::kFloat, {t, hv, key_head_dim, dv});
  check_tensor("out", out, dev, at::kBFloat16, {t, hv, dv});
  const c10::cuda::CUDAGuard guard(dev);
  const int err = cuda_gdn_chain(reinterpret_cast<const uint16_t*>(mixed.data_ptr()), mixed.stride(0), (int)nk,
                                 (int)hv, (int)key_head_dim, (int)dv, g.data_ptr<float>(), beta.data_ptr<float>(),
                                 state.data_ptr<float>(), states_out.data_ptr<float>(),
                                 reinterpret_cast<uint16_t*>(out.data_ptr()), (int)t,
                                 1.0f / std::sqrt(static_cast<float>(key_head_dim)),
                                 c10::cuda::getCurrentCUDAStream(dev.index()).stream());
  SP_CHECK(err == 0, op, ": CUDA launch failed: ", cudaGetErrorString(static_cast<cudaError_t>(err)));
}

}  // namespace
}  // namespace gdn
}  // namespace specpilot

TORCH_LIBRARY_FRAGMENT(specpilot, m) {
  m.def("gdn_chain(Tensor mixed, int num_key_heads, int key_head_dim, Tensor g, Tensor beta, Tensor state, "
        "Tensor(a!) states_out, Tensor(b!) out) -> ()");
}

TORCH_LIBRARY_IMPL(specpilot, CUDA, m) { m.impl("gdn_chain", &specpilot::gdn::gdn_chain_cuda); }
