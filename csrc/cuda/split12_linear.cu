// Launchers of the CUDA-core linear kernels for M = 1..32 tokens: split12 (M = 1 goes to the
// streamed kernel split12_stream.cu where it wins, else to linear_kernel here) and its bf16 twin.
// Exactness: bit-identical to each other and to the CPU kernels (reduction order of
// split12_format.h), whatever the bucket below.
#include <cuda_runtime.h>

#include "split12_kernel.cuh"
#include "split12_launch.h"

namespace specpilot {
namespace split12 {
namespace {

constexpr int kThreads = 128;  // 4 warps

template <class Source, int MT, int R, int U>
__global__ void __launch_bounds__(kThreads) linear_kernel(Source src, const uint16_t* x, int M, uint16_t* y, int N,
                                                          int K, bool xvec) {
  pdl_launch_dependents();  // no-op unless the next kernel was launched with PDL
  const int row0 = (blockIdx.x * (kThreads / 32) + threadIdx.x / 32) * R;
  if (row0 >= N) return;  // whole warp
  linear_warp<Source, MT, R, U>(src, x, M, y, N, K, row0, xvec);
}

// M is rounded up to a power-of-two bucket MT (extra tokens are skipped inside, warp-uniformly);
// R rows per warp reuse each x load R times; U chunks per lane in flight (split12_kernel.cuh).
template <class Source>
int launch(const Source& src, const uint16_t* x, int M, uint16_t* y, int N, int K, cudaStream_t stream) {
  const bool xvec = (K % 8 == 0) && ((reinterpret_cast<uintptr_t>(x) & 15u) == 0);
  auto go = [&](auto kernel, int rows_per_warp) {
    const int rows_per_block = rows_per_warp * (kThreads / 32);
    return launch_kernel(kernel, (N + rows_per_block - 1) / rows_per_block, kThreads, 0, stream, false, src, x, M,
                         y, N, K, xvec);
  };
  if (M <= 1) return go(linear_kernel<Source, 1, 2, 1>, 2);
  if (M <= 2) return go(linear_kernel<Source, 2, 2, 1>, 2);
  if (M <= 4) return go(linear_kernel<Source, 4, 2, 1>, 2);
  if (M <= 8) return go(linear_kernel<Source, 8, 2, 1>, 2);
  if (M <= 16) return go(linear_kernel<Source, 16, 2, 1>, 2);
  return go(linear_kernel<Source, 32, 1, 1>, 1);
}

}  // namespace

int cuda_split12_linear(const uint16_t* x, int M, const uint8_t* lo, const uint8_t* codes, const uint8_t* base,
                        const int32_t* esc_rowptr, const int32_t* esc_col, const int16_t* esc_val, int N, int K,
                        uint16_t* y, void* stream) {
  if (M < 1 || M > kCudaMaxM || N < 1 || K < 1) return (int)cudaErrorInvalidValue;
  // The streamed kernel wins where its early start counts (the layer shapes; engine AR -5%), the
  // register-fed one on very large matrices (LM head: 210 vs 228 us), docs/PERF_NOTES.md.
  constexpr int64_t kStreamMaxWeights = int64_t(1) << 28;
  if (M == 1 && (int64_t)N * K < kStreamMaxWeights && split12_stream_gemv_fits(K))
    return cuda_split12_stream_gemv(x, lo, codes, base, esc_rowptr, esc_col, esc_val, N, K, y, stream);
  const Split12Source src{{lo, codes, base, esc_rowptr, esc_col, reinterpret_cast<const uint16_t*>(esc_val)},
                          (int)round_up_kpad(K)};
  return launch(src, x, M, y, N, K, static_cast<cudaStream_t>(stream));
}

int cuda_bf16_linear(const uint16_t* x, int M, const uint16_t* w, int N, int K, uint16_t* y, void* stream) {
  if (M < 1 || M > kCudaMaxM || N < 1 || K < 1) return (int)cudaErrorInvalidValue;
  const bool wvec = (K % 8 == 0) && ((reinterpret_cast<uintptr_t>(w) & 15u) == 0);
  const Bf16Source src{w, K, wvec};
  return launch(src, x, M, y, N, K, static_cast<cudaStream_t>(stream));
}

}  // namespace split12
}  // namespace specpilot
