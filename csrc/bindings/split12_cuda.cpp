// CUDA implementations of split12_linear / bf16_linear (CUDA cores, the lane-tree order) and of
// split12_linear_tc / bf16_linear_tc (tensor cores). Schemas in split12.cpp. Out-parameter
// style and the current torch stream, so CUDA-graph capture allocates nothing.
// split12_pack stays a CPU op (python/specpilot/formats/split12/ops.py moves data); split12_unpack
// has a CUDA implementation too, returning a new tensor (the "dense" path decodes a weight on the GPU
// for a prefill, which runs eagerly).
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/extension.h>

#include "check.h"

#include "split12_checks.h"
#include "specpilot/split12_format.h"

namespace specpilot {
namespace split12 {
namespace {

const uint16_t* bits16(const at::Tensor& t) { return reinterpret_cast<const uint16_t*>(t.data_ptr()); }

void check_cuda_m(const char* op, const at::Tensor& x, int64_t M, int64_t N, int64_t K) {
  SP_CHECK(x.is_cuda(), op, ": x must be a CUDA tensor, got ", x.device());
  SP_CHECK(M <= kCudaMaxM, op, ": the CUDA kernels take M <= ", kCudaMaxM, " tokens, got M=", M,
           " (split the call into chunks of ", kCudaMaxM, ")");
  SP_CHECK(N <= INT32_MAX && K <= INT32_MAX, op, ": N=", N, " and K=", K, " must fit int32");
}

void check_launch(const char* op, int err, int64_t M, int64_t N, int64_t K) {
  SP_CHECK(err == 0, op, " CUDA launch failed for M=", M, " N=", N, " K=", K, ": ",
           cudaGetErrorString(static_cast<cudaError_t>(err)));
}

using Split12Launcher = int (*)(const uint16_t*, int, const uint8_t*, const uint8_t*, const uint8_t*,
                                const int32_t*, const int32_t*, const int16_t*, int, int, uint16_t*, void*);
using Bf16Launcher = int (*)(const uint16_t*, int, const uint16_t*, int, int, uint16_t*, void*);

template <Split12Launcher launch>
void split12_linear_cuda(const at::Tensor& x, const at::Tensor& lo, const at::Tensor& codes, const at::Tensor& base,
                         const at::Tensor& esc_rowptr, const at::Tensor& esc_col, const at::Tensor& esc_val,
                         int64_t K, at::Tensor& out) {
  const int64_t N = check_split12_args(x, lo, codes, base, esc_rowptr, esc_col, esc_val, K, out);
  const int64_t M = x.size(0);
  check_cuda_m("split12_linear", x, M, N, K);
  // The kernels read both planes with 16-byte loads (fresh torch allocations always qualify).
  SP_CHECK(reinterpret_cast<uintptr_t>(lo.data_ptr()) % 16 == 0 &&
                  reinterpret_cast<uintptr_t>(codes.data_ptr()) % 16 == 0,
           "split12_linear: lo and codes must start 16-byte aligned, got lo at ", lo.data_ptr(), ", codes at ",
           codes.data_ptr(), " (a view with a storage offset? pass .clone())");
  if (M == 0 || N == 0) return;
  const c10::cuda::CUDAGuard guard(x.device());
  const int err = launch(bits16(x), (int)M, lo.data_ptr<uint8_t>(), codes.data_ptr<uint8_t>(),
                                      base.data_ptr<uint8_t>(), esc_rowptr.data_ptr<int32_t>(),
                                      esc_col.data_ptr<int32_t>(), esc_val.data_ptr<int16_t>(), (int)N, (int)K,
                                      reinterpret_cast<uint16_t*>(out.data_ptr()),
                                      c10::cuda::getCurrentCUDAStream(x.get_device()).stream());
  check_launch("split12_linear", err, M, N, K);
}

template <Bf16Launcher launch>
void bf16_linear_cuda(const at::Tensor& x, const at::Tensor& w, at::Tensor& out) {
  SP_CHECK(w.dim() == 2, "bf16_linear: w must be 2-D [N, K], got shape ", w.sizes());
  const int64_t N = w.size(0), K = w.size(1);
  check_tensor(w, "w", at::kBFloat16, {N, K}, x.device());
  const int64_t M = check_x_out(x, out, N, K);
  check_cuda_m("bf16_linear", x, M, N, K);
  if (M == 0 || N == 0) return;
  const c10::cuda::CUDAGuard guard(x.device());
  const int err = launch(bits16(x), (int)M, bits16(w), (int)N, (int)K,
                                   reinterpret_cast<uint16_t*>(out.data_ptr()),
                                   c10::cuda::getCurrentCUDAStream(x.get_device()).stream());
  check_launch("bf16_linear", err, M, N, K);
}

at::Tensor split12_unpack_cuda(const at::Tensor& lo, const at::Tensor& codes, const at::Tensor& base,
                              const at::Tensor& esc_rowptr, const at::Tensor& esc_col, const at::Tensor& esc_val,
                              int64_t K) {
  SP_CHECK(lo.dim() == 2, "split12_unpack: lo must be 2-D [N, kpad], got shape ", lo.sizes());
  const int64_t N = lo.size(0);
  // Reuse the linear checks with an empty x / out on the planes' device (no host sync: the escape
  // table is trusted, as every CUDA op here trusts a validated Split12Tensor's).
  const at::Tensor x = at::empty({0, K}, lo.options().dtype(at::kBFloat16));
  check_split12_args(x, lo, codes, base, esc_rowptr, esc_col, esc_val, K,
                     at::empty({0, N}, lo.options().dtype(at::kBFloat16)));
  SP_CHECK(N <= INT32_MAX && K <= INT32_MAX, "split12_unpack: N=", N, " and K=", K, " must fit int32");
  SP_CHECK(reinterpret_cast<uintptr_t>(lo.data_ptr()) % 8 == 0 && reinterpret_cast<uintptr_t>(codes.data_ptr()) % 4 == 0,
           "split12_unpack: lo must start 8-byte and codes 4-byte aligned, got lo at ", lo.data_ptr(), ", codes at ",
           codes.data_ptr(), " (a view with a storage offset? pass .clone())");
  at::Tensor w = at::empty({N, K}, lo.options().dtype(at::kBFloat16));
  const c10::cuda::CUDAGuard guard(lo.device());
  const Split12Planes planes{lo.data_ptr<uint8_t>(), codes.data_ptr<uint8_t>(), base.data_ptr<uint8_t>(),
                             esc_rowptr.data_ptr<int32_t>(), esc_col.data_ptr<int32_t>(),
                             reinterpret_cast<const uint16_t*>(esc_val.data_ptr())};
  const int err = cuda_split12_unpack(planes, (int)N, (int)K, reinterpret_cast<uint16_t*>(w.data_ptr()),
                                      c10::cuda::getCurrentCUDAStream(lo.get_device()).stream());
  check_launch("split12_unpack", err, 0, N, K);
  return w;
}

}  // namespace
}  // namespace split12
}  // namespace specpilot

TORCH_LIBRARY_IMPL(specpilot, CUDA, m) {
  using namespace specpilot::split12;
  m.impl("split12_linear", &split12_linear_cuda<cuda_split12_linear>);
  m.impl("bf16_linear", &bf16_linear_cuda<cuda_bf16_linear>);
  m.impl("split12_linear_tc", &split12_linear_cuda<cuda_split12_linear_tc>);
  m.impl("bf16_linear_tc", &bf16_linear_cuda<cuda_bf16_linear_tc>);
  m.impl("split12_unpack", &split12_unpack_cuda);
}
