// split12 -> bf16 on the GPU, bit for bit the inverse of the packer (cpu_unpack's result).
// Why: for many token rows (prefill) a linear is compute-bound, so Split12Linear's "dense" path
// decodes its weight into a scratch matrix and hands it to cuBLAS: the split12 model's prefill is
// then the bf16 model's own GEMM, bit for bit (formats/split12/ops.py).
// Two kernels on one stream: every 8-column group from its code word and lo bytes (decode8), then
// each row's escapes written over their columns.
#include <cuda_runtime.h>

#include "specpilot/split12_format.h"

namespace specpilot {
namespace split12 {
namespace {

constexpr int kUnpackThreads = 256;

// One thread per 8-column group of a row's K columns (padding groups past K are not written: they
// would land in the next row).
__global__ void unpack_groups_kernel(Split12Planes p, int N, int K, int kpad, uint16_t* w) {
  const int groups = (K + kGroup - 1) / kGroup;
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (int64_t)N * groups) return;
  const int n = (int)(i / groups), k0 = (int)(i % groups) * kGroup;
  const uint32_t code_word = *reinterpret_cast<const uint32_t*>(p.codes + (int64_t)n * (kpad / 2) + k0 / 2);
  const uint2 lo = *reinterpret_cast<const uint2*>(p.lo + (int64_t)n * kpad + k0);
  uint32_t pairs[4];
  decode8(code_word, lo.x, lo.y, p.base[n] * 0x01010101u, pairs);
  uint16_t* row = w + (int64_t)n * K;
  if (K % kGroup == 0) {  // rows start 16-byte aligned, and every group is whole
    *reinterpret_cast<uint4*>(row + k0) = make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);
    return;
  }
#pragma unroll
  for (int j = 0; j < kGroup; ++j) {  // unrolled: pairs stays in registers
    if (k0 + j < K) row[k0 + j] = (uint16_t)(pairs[j / 2] >> (16 * (j % 2)));
  }
}

__global__ void unpack_escapes_kernel(const int32_t* esc_rowptr, const int32_t* esc_col, const uint16_t* esc_val,
                                      int N, int K, uint16_t* w) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= N) return;
  for (int e = esc_rowptr[n]; e < esc_rowptr[n + 1]; ++e) w[(int64_t)n * K + esc_col[e]] = esc_val[e];
}

}  // namespace

int cuda_split12_unpack(const Split12Planes& planes, int N, int K, uint16_t* w, void* stream) {
  if (N == 0) return 0;
  const int kpad = (int)round_up_kpad(K);
  const int64_t groups = (int64_t)N * ((K + kGroup - 1) / kGroup);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  unpack_groups_kernel<<<(unsigned)((groups + kUnpackThreads - 1) / kUnpackThreads), kUnpackThreads, 0, s>>>(
      planes, N, K, kpad, w);
  unpack_escapes_kernel<<<(N + kUnpackThreads - 1) / kUnpackThreads, kUnpackThreads, 0, s>>>(
      planes.esc_rowptr, planes.esc_col, planes.esc_val, N, K, w);
  return (int)cudaGetLastError();
}

}  // namespace split12
}  // namespace specpilot
