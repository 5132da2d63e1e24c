// Schemas and CUDA impls of the Gated DeltaNet layer's fused small ops (kernels: csrc/cuda/gdn_fused.cu,
// contract: specpilot/gdn_fused.h): gdn_prologue (conv update, SiLU, gates) and gdn_gated_norm (the
// gated RMSNorm epilogue). CUDA only: elsewhere python/specpilot/kernels/gdn_fused.py runs the torch
// path. Out-parameter style on torch's current stream (nothing allocated inside the ops).
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <vector>

#include "check.h"
#include "specpilot/gdn_fused.h"

namespace specpilot {
namespace gdn {
namespace {

void check_on(const char* op, const char* name, const at::Tensor& t, const at::Device& device) {
  SP_CHECK(t.device() == device, op, ": ", name, " is on ", t.device(), " but the first input is on ", device);
}

// A [rows, cols] bf16 matrix whose rows may be strided (a column slice of a wider projection).
void check_rows(const char* op, const char* name, const at::Tensor& t, const at::Device& device, int64_t rows,
                int64_t cols) {
  check_on(op, name, t, device);
  SP_CHECK(t.scalar_type() == at::kBFloat16, op, ": ", name, " must be BFloat16, got ", t.scalar_type());
  SP_CHECK(t.dim() == 2 && t.size(0) == rows && t.size(1) == cols, op, ": ", name, " must have shape [",
           rows, ", ", cols, "], got ", t.sizes());
  SP_CHECK(t.stride(1) == 1 || cols == 1, op, ": ", name, " must have unit column stride, got strides ", t.strides());
}

void check_dense(const char* op, const char* name, const at::Tensor& t, const at::Device& device,
                 at::ScalarType dtype, const std::vector<int64_t>& shape) {
  check_on(op, name, t, device);
  SP_CHECK(t.scalar_type() == dtype, op, ": ", name, " must be ", c10::toString(dtype), ", got ", t.scalar_type());
  SP_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous");
  SP_CHECK(t.sizes().vec() == shape, op, ": ", name, " must have shape ", c10::IntArrayRef(shape), ", got ",
           t.sizes());
}

// A per-head (or per-channel) parameter vector: fp32 or bf16, contiguous, n entries. Returns is-bf16.
bool check_param(const char* op, const char* name, const at::Tensor& t, const at::Device& device, int64_t n) {
  check_on(op, name, t, device);
  SP_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16, op, ": ", name,
           " must be Float or BFloat16, got ", t.scalar_type());
  SP_CHECK(t.dim() == 1 && t.size(0) == n && t.is_contiguous(), op, ": ", name, " must be a contiguous [", n,
           "] vector, got shape ", t.sizes());
  return t.scalar_type() == at::kBFloat16;
}

const uint16_t* bits(const at::Tensor& t) { return reinterpret_cast<const uint16_t*>(t.data_ptr()); }
uint16_t* bits_out(const at::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr()); }

void gdn_prologue_cuda(const at::Tensor& qkv, const at::Tensor& b, const at::Tensor& a, const at::Tensor& conv_state,
                       const at::Tensor& conv_weight, const at::Tensor& a_log, const at::Tensor& dt_bias,
                       const at::Tensor& window, const at::Tensor& mixed, const at::Tensor& g, const at::Tensor& beta) {
  const char* op = "gdn_prologue";
  SP_CHECK(qkv.is_cuda(), op, ": qkv must be a CUDA tensor, got one on ", qkv.device());
  SP_CHECK(qkv.dim() == 2, op, ": qkv must be [tokens, conv channels], got shape ", qkv.sizes());
  SP_CHECK(conv_weight.dim() == 2, op, ": conv_weight must be [conv channels, width], got shape ",
           conv_weight.sizes());
  SP_CHECK(b.dim() == 2, op, ": b must be [tokens, value heads], got shape ", b.sizes());
  const at::Device dev = qkv.device();
  const int64_t t = qkv.size(0), c = qkv.size(1), hv = b.size(1), width = conv_weight.size(1);
  SP_CHECK(t >= 1, op, ": at least one token is needed");
  SP_CHECK(width >= 2 && width <= 4, op, ": conv width must be 2, 3 or 4, got ", width);
  check_rows(op, "qkv", qkv, dev, t, c);
  check_rows(op, "b", b, dev, t, hv);
  check_rows(op, "a", a, dev, t, hv);
  check_dense(op, "conv_state", conv_state, dev, at::kBFloat16, {c, width - 1});
  check_dense(op, "conv_weight", conv_weight, dev, at::kBFloat16, {c, width});
  const bool a_log_bf16 = check_param(op, "A_log", a_log, dev, hv);
  const bool dt_bias_bf16 = check_param(op, "dt_bias", dt_bias, dev, hv);
  check_dense(op, "window", window, dev, at::kBFloat16, {c, width - 1 + t});
  check_dense(op, "mixed", mixed, dev, at::kBFloat16, {t, c});
  check_dense(op, "g", g, dev, at::kFloat, {t, hv});
  check_dense(op, "beta", beta, dev, at::kFloat, {t, hv});
  const c10::cuda::CUDAGuard guard(dev);
  const int err = cuda_gdn_prologue(bits(qkv), qkv.stride(0), bits(b), b.stride(0), bits(a), a.stride(0),
                                    bits(conv_state), bits(conv_weight), a_log.data_ptr(), a_log_bf16,
                                    dt_bias.data_ptr(), dt_bias_bf16, (int)c, (int)width, (int)hv, (int)t,
                                    bits_out(window), bits_out(mixed), g.data_ptr<float>(), beta.data_ptr<float>(),
                                    c10::cuda::getCurrentCUDAStream(dev.index()).stream());
  SP_CHECK(err == 0, op, ": CUDA launch failed: ", cudaGetErrorString(static_cast<cudaError_t>(err)));
}

void gdn_gated_norm_cuda(const at::Tensor& x, const at::Tensor& z, const at::Tensor& weight, double eps,
                         const at::Tensor& out) {
  const char* op = "gdn_gated_norm";
  SP_CHECK(x.is_cuda(), op, ": x must be a CUDA tensor, got one on ", x.device());
  SP_CHECK(x.dim() == 2, op, ": x must be [rows, heads * head_dim], got shape ", x.sizes());
  SP_CHECK(weight.dim() == 1 && weight.size(0) >= 1, op, ": weight must be a [head_dim] vector, got shape ",
           weight.sizes());
  const at::Device dev = x.device();
  const int64_t rows = x.size(0), width = x.size(1), dv = weight.size(0);
  SP_CHECK(rows >= 1, op, ": at least one row is needed");
  SP_CHECK(width % dv == 0, op, ": x has ", width, " columns, not a multiple of head_dim ", dv);
  SP_CHECK(eps > 0, op, ": eps must be positive, got ", eps);
  check_rows(op, "x", x, dev, rows, width);
  check_rows(op, "z", z, dev, rows, width);
  const bool weight_bf16 = check_param(op, "weight", weight, dev, dv);
  check_dense(op, "out", out, dev, at::kBFloat16, {rows, width});
  const c10::cuda::CUDAGuard guard(dev);
  const int err = cuda_gdn_gated_norm(bits(x), x.stride(0), bits(z), z.stride(0), weight.data_ptr(), weight_bf16,
                                      (int)rows, (int)(width / dv), (int)dv, (float)eps, bits_out(out),
                                      c10::cuda::getCurrentCUDAStream(dev.index()).stream());
  SP_CHECK(err == 0, op, ": CUDA launch failed: ", cudaGetErrorString(static_cast<cudaError_t>(err)));
}

}  // namespace
}  // namespace gdn
}  // namespace specpilot

TORCH_LIBRARY_FRAGMENT(specpilot, m) {
  m.def("gdn_prologue(Tensor qkv, Tensor b, Tensor a, Tensor conv_state, Tensor conv_weight, Tensor A_log, "
        "Tensor dt_bias, Tensor(a!) window, Tensor(b!) mixed, Tensor(c!) g, Tensor(d!) beta) -> ()");
  m.def("gdn_gated_norm(Tensor x, Tensor z, Tensor weight, float eps, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(specpilot, CUDA, m) {
  m.impl("gdn_prologue", &specpilot::gdn::gdn_prologue_cuda);
  m.impl("gdn_gated_norm", &specpilot::gdn::gdn_gated_norm_cuda);
}
