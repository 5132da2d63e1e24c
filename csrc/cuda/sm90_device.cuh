// Device helpers shared by the hand-written sm_90 kernels (decode attention, the one-token GEMV,
// the skinny GEMM): programmatic dependent launch and the bf16 tensor-core mma. (The split12
// kernels keep their own copies in split12_kernel.cuh, which NVRTC and the host emulation test
// compile on their own.)
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace specpilot {
namespace sm90 {

// Programmatic dependent launch; both are no-ops when the launch did not ask for PDL.
// pdl_launch_dependents: the next kernel of the stream may launch now. pdl_wait: wait until the
// previous kernel is complete and its writes are visible.
__device__ __forceinline__ void pdl_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;\n" ::); }
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

// c[16x8] += a[16x16] b[16x8], bf16 in, fp32 accumulate (mma.m16n8k16 fragment layouts).
__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace sm90
}  // namespace specpilot
