// Schema and CUDA impl of the one-token bf16 GEMV with a fused add+RMSNorm or SiLU*mul prologue:
// gemv_m1 (csrc/cuda/gemv_m1.cu). CUDA only (models/gemv_fusion.py falls back to the separate ops
// elsewhere). Out-parameters, torch's current stream: capturable, allocation-free.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/extension.h>

#include "check.h"

#include <string>

#include "specpilot/gemv_m1.h"

namespace specpilot {
namespace gemv {
namespace {

// A contiguous, 16-byte aligned bf16 CUDA tensor of `numel` elements on `device`.
void check_vector(const char* name, const at::Tensor& t, int64_t numel, const at::Device& device) {
  SP_CHECK(t.is_cuda(), "gemv_m1: ", name, " must be a CUDA tensor, got one on ", t.device());
  SP_CHECK(t.device() == device, "gemv_m1: ", name, " is on ", t.device(), " but the weight is on ", device);
  SP_CHECK(t.scalar_type() == at::kBFloat16, "gemv_m1: ", name, " must be bfloat16, got ", t.scalar_type());
  SP_CHECK(t.is_contiguous(), "gemv_m1: ", name, " must be contiguous, got strides ", t.strides());
  SP_CHECK(t.numel() == numel, "gemv_m1: ", name, " must hold ", numel, " values (one token), got shape ",
           t.sizes());
  SP_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, "gemv_m1: ", name,
           " must start 16-byte aligned (pass .contiguous())");
}

const uint16_t* bits(const at::Tensor& t) { return reinterpret_cast<const uint16_t*>(t.data_ptr()); }
uint16_t* mutable_bits(const at::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr()); }

// The shared arguments: x, the prologue's tensors and y, for a weight of N x K on `dev`.
GemvArgs io_args(int64_t N, int64_t K, const at::Device& dev, const at::Tensor& x,
                 const std::optional<at::Tensor>& delta, const std::optional<at::Tensor>& norm_weight, double eps,
                 int64_t prologue, bool pdl, const at::Tensor& y, const std::optional<at::Tensor>& sum_out) {
  SP_CHECK(K % 8 == 0 && K >= 8 && K <= kMaxK, "gemv_m1: K must be a multiple of 8 in 8..", kMaxK, ", got ", K);
  SP_CHECK(N >= 1 && N <= INT32_MAX, "gemv_m1: N must be in 1..2^31-1, got ", N);
  SP_CHECK(prologue >= kGemvPlain && prologue <= kGemvSiluMul, "gemv_m1: prologue must be 0 (plain), 1 "
           "(add + RMSNorm) or 2 (SiLU * mul), got ", prologue);
  check_vector("x", x, prologue == kGemvSiluMul ? 2 * K : K, dev);
  check_vector("y", y, N, dev);
  GemvArgs a{};
  if (prologue == kGemvAddNorm) {
    SP_CHECK(K <= kMaxNormHidden, "gemv_m1: the add + RMSNorm prologue takes K <= ", kMaxNormHidden, ", got ", K);
    SP_CHECK(norm_weight.has_value(), "gemv_m1: the add + RMSNorm prologue needs norm_weight");
    check_vector("norm_weight", *norm_weight, K, dev);
    SP_CHECK(delta || !sum_out, "gemv_m1: sum_out is written only with a delta (without one the sum is x)");
    if (delta) check_vector("delta", *delta, K, dev);
    if (sum_out) check_vector("sum_out", *sum_out, K, dev);
    a.delta = delta ? bits(*delta) : nullptr;
    a.norm_w = bits(*norm_weight);
    a.sum_out = sum_out ? mutable_bits(*sum_out) : nullptr;
  } else {
    SP_CHECK(!delta && !norm_weight && !sum_out, "gemv_m1: delta, norm_weight and sum_out belong to the "
             "add + RMSNorm prologue (1), got prologue ", prologue);
  }
  a.n = (int)N;
  a.k = (int)K;
  a.prologue = (int)prologue;
  a.x = bits(x);
  a.eps = (float)eps;
  a.y = mutable_bits(y);
  a.pdl = pdl;
  return a;
}

void check_launch(const char* op, int err, const GemvArgs& a) {
  SP_CHECK(err == 0, op, ": CUDA launch failed for N=", a.n, " K=", a.k, " prologue ", a.prologue, ": ",
           cudaGetErrorString(static_cast<cudaError_t>(err)));
}

void gemv_m1_cuda(const at::Tensor& weight, const at::Tensor& x, const std::optional<at::Tensor>& delta,
                  const std::optional<at::Tensor>& norm_weight, double eps, int64_t prologue, bool pdl,
                  const at::Tensor& y, const std::optional<at::Tensor>& sum_out) {
  const at::Device dev = weight.device();
  SP_CHECK(weight.dim() == 2, "gemv_m1: weight must be [N, K], got shape ", weight.sizes());
  const int64_t N = weight.size(0), K = weight.size(1);
  GemvArgs a = io_args(N, K, dev, x, delta, norm_weight, eps, prologue, pdl, y, sum_out);
  check_vector("weight", weight, N * K, dev);
  a.w = bits(weight);
  const c10::cuda::CUDAGuard guard(dev);
  check_launch("gemv_m1", cuda_gemv_m1(a, c10::cuda::getCurrentCUDAStream(dev.index()).stream()), a);
}

}  // namespace
}  // namespace gemv
}  // namespace specpilot

TORCH_LIBRARY_FRAGMENT(specpilot, m) {
  m.def("gemv_m1(Tensor weight, Tensor x, Tensor? delta, Tensor? norm_weight, float eps, int prologue, bool pdl, "
        "Tensor(a!) y, Tensor(b!)? sum_out) -> ()");
}

TORCH_LIBRARY_IMPL(specpilot, CUDA, m) {
  m.impl("gemv_m1", &specpilot::gemv::gemv_m1_cuda);
}
