// Schemas and CUDA impls of the skinny tensor-core GEMMs (csrc/cuda/skinny_gemm.cu for bf16
// weights, csrc/cuda/split12_skinny.cu for split12 weights, the same workspace) and the grid
// planner. CUDA only (models/skinny_linear.py falls back to torch elsewhere). Out-parameters and a
// caller-owned workspace, torch's current stream: capturable, allocation-free.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/extension.h>

#include "check.h"

#include "specpilot/skinny_gemm.h"
#include "split12_checks.h"

namespace specpilot {
namespace skinny {
namespace {

// A contiguous, 16-byte aligned CUDA tensor of `dtype` and `numel` elements on `device`.
void check_tensor(const char* name, const at::Tensor& t, at::ScalarType dtype, int64_t numel,
                  const at::Device& device) {
  SP_CHECK(t.is_cuda(), "skinny GEMM: ", name, " must be a CUDA tensor, got one on ", t.device());
  SP_CHECK(t.device() == device, "skinny GEMM: ", name, " is on ", t.device(), " but the weight is on ", device);
  SP_CHECK(t.scalar_type() == dtype, "skinny GEMM: ", name, " must be ", c10::toString(dtype), ", got ",
           t.scalar_type());
  SP_CHECK(t.is_contiguous(), "skinny GEMM: ", name, " must be contiguous, got strides ", t.strides());
  SP_CHECK(t.numel() >= numel, "skinny GEMM: ", name, " must hold ", numel, " values, got shape ", t.sizes());
  SP_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, "skinny GEMM: ", name,
           " must start 16-byte aligned (pass .contiguous())");
}

// What both ops check and pass alike: x [M, K] and y [M, N] bf16, the grid and its workspace;
// then the launch on torch's current stream, its error named. `launch(args, stream)` runs the kernel.
template <class Args, class Launch>
void launch_rows(const char* op, Args& a, const at::Tensor& x, int64_t N, int64_t K, int64_t ctas, bool pdl,
                 const at::Tensor& y, const at::Tensor& partials, const at::Tensor& counters, const at::Device& dev,
                 Launch launch) {
  SP_CHECK(K % 8 == 0 && K >= 8 && K <= INT32_MAX, op, ": K must be a positive multiple of 8, got ", K);
  SP_CHECK(N >= 1 && N <= INT32_MAX, op, ": N must be in 1..2^31-1, got ", N);
  SP_CHECK(x.dim() == 2, op, ": x must be [M, K], got shape ", x.sizes());
  const int64_t M = x.size(0);
  SP_CHECK(M >= 1 && M <= kMaxM, op, ": M must be in 1..", kMaxM, ", got ", M);
  SP_CHECK(x.size(1) == K, op, ": x must have ", K, " columns for this weight, got ", x.sizes());
  SP_CHECK(y.dim() == 2 && y.size(0) == M && y.size(1) == N, op, ": y must be [", M, ", ", N, "], got ", y.sizes());
  SP_CHECK(ctas >= 0 && ctas <= 65535, op, ": ctas must be 0 (auto) or 1..65535, got ", ctas);
  check_tensor("x", x, at::kBFloat16, M * K, dev);
  check_tensor("y", y, at::kBFloat16, M * N, dev);
  const int used = ctas > 0 ? (int)ctas : skinny_ctas((int)N, (int)K);
  check_tensor("partials", partials, at::kFloat, skinny_partials_floats(used, (int)N), dev);
  check_tensor("counters", counters, at::kInt, skinny_counters((int)N), dev);
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
  const int err = launch(a, c10::cuda::getCurrentCUDAStream(dev.index()).stream());
  SP_CHECK(err == 0, op, ": CUDA launch failed for M=", M, " N=", N, " K=", K, ": ",
           cudaGetErrorString(static_cast<cudaError_t>(err)));
}

void skinny_gemm_cuda(const at::Tensor& weight, const at::Tensor& x, int64_t ctas, bool pdl,
                      const at::Tensor& y, const at::Tensor& partials, const at::Tensor& counters) {
  SP_CHECK(weight.dim() == 2, "skinny_gemm: weight must be [N, K], got shape ", weight.sizes());
  const int64_t N = weight.size(0), K = weight.size(1);
  check_tensor("weight", weight, at::kBFloat16, N * K, weight.device());
  SkinnyArgs a{};
  a.w = reinterpret_cast<const uint16_t*>(weight.data_ptr());
  launch_rows("skinny_gemm", a, x, N, K, ctas, pdl, y, partials, counters, weight.device(), cuda_skinny_gemm);
}

// y = x W^T with W in split12 planes (format v1): bit-identical to skinny_gemm on the unpacked W.
void split12_skinny_gemm_cuda(const at::Tensor& x, const at::Tensor& lo, const at::Tensor& codes,
                              const at::Tensor& base, const at::Tensor& esc_rowptr, const at::Tensor& esc_col,
                              const at::Tensor& esc_val, int64_t K, int64_t ctas, bool pdl, const at::Tensor& y,
                              const at::Tensor& partials, const at::Tensor& counters) {
  const int64_t N = split12::check_split12_args(x, lo, codes, base, esc_rowptr, esc_col, esc_val, K, y);
  check_tensor("lo", lo, at::kByte, lo.numel(), x.device());  // TMA reads both planes: 16-byte aligned
  check_tensor("codes", codes, at::kByte, codes.numel(), x.device());
  Split12SkinnyArgs a{};
  a.planes = {lo.data_ptr<uint8_t>(), codes.data_ptr<uint8_t>(), base.data_ptr<uint8_t>(),
              esc_rowptr.data_ptr<int32_t>(), esc_col.data_ptr<int32_t>(),
              reinterpret_cast<const uint16_t*>(esc_val.data_ptr())};
  launch_rows("split12_skinny_gemm", a, x, N, K, ctas, pdl, y, partials, counters, x.device(),
              cuda_split12_skinny_gemm);
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
  m.def("split12_skinny_gemm(Tensor x, Tensor lo, Tensor codes, Tensor base, Tensor esc_rowptr, Tensor esc_col, "
        "Tensor esc_val, int K, int ctas, bool pdl, Tensor(a!) y, Tensor(b!) partials, Tensor(c!) counters) -> ()");
  m.def("skinny_plan_ctas(int n, int k) -> int", &specpilot::skinny::skinny_plan_ctas);
  m.def("skinny_partials_count(int ctas, int n) -> int", &specpilot::skinny::skinny_partials_count);
  m.def("skinny_counter_count(int n) -> int", &specpilot::skinny::skinny_counter_count);
}

TORCH_LIBRARY_IMPL(specpilot, CUDA, m) {
  m.impl("skinny_gemm", &specpilot::skinny::skinny_gemm_cuda);
  m.impl("split12_skinny_gemm", &specpilot::skinny::split12_skinny_gemm_cuda);
}
