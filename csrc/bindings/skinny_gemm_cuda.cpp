// Schema and CUDA impl of the skinny tensor-core GEMM (csrc/cuda/skinny_gemm.cu) and its grid
// planner. CUDA only (models/skinny_linear.py falls back to torch elsewhere). Out-parameters and a
// caller-owned workspace, torch's current stream: capturable, allocation-free.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/extension.h>

#include "check.h"

#include "specpilot/skinny_gemm.h"

namespace specpilot {
namespace skinny {
namespace {

// A contiguous, 16-byte aligned CUDA tensor of `dtype` and `numel` elements on `device`.
void check_tensor(const char* name, const at::Tensor& t, at::ScalarType dtype, int64_t numel,
                  const at::Device& device) {
  SP_CHECK(t.is_cuda(), "skinny_gemm: ", name, " must be a CUDA tensor, got one on ", t.device());
  SP_CHECK(t.device() == device, "skinny_gemm: ", name, " is on ", t.device(), " but the weight is on ", device);
  SP_CHECK(t.scalar_type() == dtype, "skinny_gemm: ", name, " must be ", c10::toString(dtype), ", got ",
           t.scalar_type());
  SP_CHECK(t.is_contiguous(), "skinny_gemm: ", name, " must be contiguous, got strides ", t.strides());
  SP_CHECK(t.numel() >= numel, "skinny_gemm: ", name, " must hold ", numel, " values, got shape ", t.sizes());
  SP_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, "skinny_gemm: ", name,
           " must start 16-byte aligned (pass .contiguous())");
}

void skinny_gemm_cuda(const at::Tensor& weight, const at::Tensor& x, int64_t ctas, bool pdl,
                      const at::Tensor& y, const at::Tensor& partials, const at::Tensor& counters) {
  SP_CHECK(weight.dim() == 2, "skinny_gemm: weight must be [N, K], got shape ", weight.sizes());
  const int64_t N = weight.size(0), K = weight.size(1);
  SP_CHECK(K % 8 == 0 && K >= 8 && K <= INT32_MAX, "skinny_gemm: K must be a positive multiple of 8, got ", K);
  SP_CHECK(N >= 1 && N <= INT32_MAX, "skinny_gemm: N must be in 1..2^31-1, got ", N);
  SP_CHECK(x.dim() == 2, "skinny_gemm: x must be [M, K], got shape ", x.sizes());
  const int64_t M = x.size(0);
  SP_CHECK(M >= 1 && M <= kMaxM, "skinny_gemm: M must be in 1..", kMaxM, ", got ", M);
  SP_CHECK(x.size(1) == K, "skinny_gemm: x must have ", K, " columns for this weight, got ", x.sizes());
  SP_CHECK(y.dim() == 2 && y.size(0) == M && y.size(1) == N, "skinny_gemm: y must be [", M, ", ", N, "], got ",
           y.sizes());
  SP_CHECK(ctas >= 0 && ctas <= 65535, "skinny_gemm: ctas must be 0 (auto) or 1..65535, got ", ctas);
  const at::Device dev = weight.device();
  check_tensor("weight", weight, at::kBFloat16, N * K, dev);
  check_tensor("x", x, at::kBFloat16, M * K, dev);
  check_tensor("y", y, at::kBFloat16, M * N, dev);
  const int used = ctas > 0 ? (int)ctas : skinny_ctas((int)N, (int)K);
  check_tensor("partials", partials, at::kFloat, skinny_partials_floats(used, (int)N), dev);
  check_tensor("counters", counters, at::kInt, skinny_counters((int)N), dev);

  SkinnyArgs a{};
  a.w = reinterpret_cast<const uint16_t*>(weight.data_ptr());
  a.n = (int)N;
  a.k = (int)K;
  a.x = reinterpret_cast<const uint16_t*>(x.data_ptr());
  a.m = (int)M;
  a.y = reinterpret_cast<uint16_t*>(y.data_ptr());
  a.partials = partials.data_ptr<float>();
  a.counters = counters.data_ptr<int>();
  a.ctas = used;
  a.pdl = pdl;
  const c10::cuda::CUDAGuard guard(dev);
  const int err = cuda_skinny_gemm(a, c10::cuda::getCurrentCUDAStream(dev.index()).stream());
  SP_CHECK(err == 0, "skinny_gemm: CUDA launch failed for M=", M, " N=", N, " K=", K, ": ",
           cudaGetErrorString(static_cast<cudaError_t>(err)));
}

// The grid skinny_gemm uses for N x K with ctas = 0, and the workspace a grid needs.
int64_t skinny_plan_ctas(int64_t n, int64_t k) {
  SP_CHECK(n >= 1 && n <= INT32_MAX && k >= 8 && k <= INT32_MAX, "skinny_plan_ctas: bad shape ", n, " x ", k);
  return skinny_ctas((int)n, (int)k);
}

int64_t skinny_partials_count(int64_t ctas, int64_t n) {
  SP_CHECK(ctas >= 1 && ctas <= 65535 && n >= 1 && n <= INT32_MAX, "skinny_partials_count: bad grid ", ctas,
           " or N ", n);
  return skinny_partials_floats((int)ctas, (int)n);
}

int64_t skinny_counter_count(int64_t n) {
  SP_CHECK(n >= 1 && n <= INT32_MAX, "skinny_counter_count: bad N ", n);
  return skinny_counters((int)n);
}

}  // namespace
}  // namespace skinny
}  // namespace specpilot

TORCH_LIBRARY_FRAGMENT(specpilot, m) {
  m.def("skinny_gemm(Tensor weight, Tensor x, int ctas, bool pdl, Tensor(a!) y, "
        "Tensor(b!) partials, Tensor(c!) counters) -> ()");
  m.def("skinny_plan_ctas(int n, int k) -> int", &specpilot::skinny::skinny_plan_ctas);
  m.def("skinny_partials_count(int ctas, int n) -> int", &specpilot::skinny::skinny_partials_count);
  m.def("skinny_counter_count(int n) -> int", &specpilot::skinny::skinny_counter_count);
}

TORCH_LIBRARY_IMPL(specpilot, CUDA, m) { m.impl("skinny_gemm", &specpilot::skinny::skinny_gemm_cuda); }
