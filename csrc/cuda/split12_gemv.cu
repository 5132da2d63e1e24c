// split12 GEMV (M = 1): the kernel of the NVRTC launch contract (abi/split12_gemv.h) and its
// launcher. This file is also the baseline an agent variant starts from, so the kernel part
// compiles under NVRTC (no torch, no std headers; bf16 as raw uint16 bits).
// Exactness: bit-identical to cpu_split12_linear / bf16_linear (split12_format.h order).
#include "specpilot/abi/split12_gemv.h"
#include "split12_kernel.cuh"

#ifdef __CUDACC_RTC__
// The launch geometry, for the JIT launcher (see the contract header). NVRTC only: under nvcc's
// whole-program mode an extern "C" __constant__ leaves an undefined host symbol in the extension.
extern "C" __constant__ int split12_gemv_geometry[2] = {SPLIT12_GEMV_THREADS, SPLIT12_GEMV_ROWS_PER_BLOCK};
#endif

extern "C" __global__ void __launch_bounds__(SPLIT12_GEMV_THREADS)
split12_gemv(const uint8_t* lo, const uint8_t* codes, const uint8_t* base, const int* esc_rowptr,
             const int* esc_col, const unsigned short* esc_val, const unsigned short* x, unsigned short* y,
             int N, int K, int kpad) {
  using namespace specpilot::split12;
  pdl_launch_dependents();  // no-op unless the next kernel was launched with PDL
  constexpr int kRowsPerWarp = SPLIT12_GEMV_ROWS_PER_BLOCK / (SPLIT12_GEMV_THREADS / 32);
  const Split12Source src{{lo, codes, base, esc_rowptr, esc_col, esc_val}, kpad};
  const int row0 = blockIdx.x * SPLIT12_GEMV_ROWS_PER_BLOCK + (threadIdx.x / 32) * kRowsPerWarp;
  if (row0 >= N) return;  // whole warp leaves together: the butterfly needs all 32 lanes
  const bool xvec = (K % 8 == 0) && ((reinterpret_cast<unsigned long long>(x) & 15ull) == 0);
  linear_warp<Split12Source, 1, kRowsPerWarp, SPLIT12_GEMV_UNROLL>(src, x, 1, y, N, K, row0, xvec);
}

#ifndef __CUDACC_RTC__
#include <cuda_runtime.h>

#include "split12_launch.h"

namespace specpilot {
namespace split12 {

int cuda_split12_gemv(const uint16_t* x, const uint8_t* lo, const uint8_t* codes, const uint8_t* base,
                      const int32_t* esc_rowptr, const int32_t* esc_col, const int16_t* esc_val, int N, int K,
                      uint16_t* y, void* stream) {
  const int blocks = (N + SPLIT12_GEMV_ROWS_PER_BLOCK - 1) / SPLIT12_GEMV_ROWS_PER_BLOCK;
  return launch_kernel(split12_gemv, blocks, SPLIT12_GEMV_THREADS, 0, static_cast<cudaStream_t>(stream),
                       cuda_kernel_variant() == kCudaVariantPdl, lo, codes, base, esc_rowptr, esc_col,
                       reinterpret_cast<const unsigned short*>(esc_val), x, y, N, K, (int)round_up_kpad(K));
}

}  // namespace split12
}  // namespace specpilot
#endif
