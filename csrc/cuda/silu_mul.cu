// silu_mul: the SwiGLU gate, [gate | up] rows of 2I -> out rows of I, one thread per 8 outputs
// (16-byte loads) or per output where I % 8 != 0.
//   out = bf16( bf16(silu(gate)) * up ),  silu(g) = g / (1 + expf(-g)) in fp32
// Exactness: torch's bf16 silu is that same fp32 expression rounded to bf16 (ATen's silu kernel,
// c10::cuda::compat::exp = expf, IEEE division; neither build uses fast math), so the result is
// expected bit-identical to F.silu(gate) * up; the GPU test allows 1 bf16 ulp should an expf
// implementation differ.
// Launched with PDL: it lets the next kernel start at once (a skinny GEMM then streams its first
// weights while this runs) and waits for the previous one before reading anything.
#include <cuda_runtime.h>

#include "fused_bf16.cuh"
#include "sm90_device.cuh"
#include "specpilot/fused_ops.h"
#include "split12_launch.h"  // launch_kernel

namespace specpilot {
namespace fused {
namespace {

// VEC = 8: I % 8 == 0 and 16-byte aligned rows; VEC = 1 otherwise.
template <int VEC>
__global__ void silu_mul_kernel(const uint16_t* __restrict__ gate_up, int64_t rows, int64_t inter,
                                uint16_t* __restrict__ out) {
  sm90::pdl_launch_dependents();
  sm90::pdl_wait();  // gate_up is the previous kernel's output
  const int64_t per_row = inter / VEC, total = rows * per_row;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / per_row, c = (i % per_row) * VEC;
    const uint16_t* g = gate_up + r * 2 * inter + c;
    uint16_t* o = out + r * inter + c;
    if constexpr (VEC == 8) {
      const uint4 gv = *reinterpret_cast<const uint4*>(g), uv = *reinterpret_cast<const uint4*>(g + inter);
      uint4 ov = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
      for (int j = 0; j < 8; ++j) vec_set(ov, j, silu_times(vec_get(gv, j), vec_get(uv, j)));
      *reinterpret_cast<uint4*>(o) = ov;
    } else {
      *o = f32_to_bf16(silu_times(bf16_to_f32(g[0]), bf16_to_f32(g[inter])));
    }
  }
}

}  // namespace

int cuda_silu_mul(const uint16_t* gate_up, int64_t rows, int64_t inter, uint16_t* out, void* stream) {
  if (rows == 0 || inter == 0) return 0;
  const bool vec = inter % 8 == 0 && (reinterpret_cast<uintptr_t>(gate_up) & 15u) == 0 &&
                   (reinterpret_cast<uintptr_t>(out) & 15u) == 0;
  const int64_t items = rows * (vec ? inter / 8 : inter);
  constexpr int kThreads = 256;
  constexpr int64_t kMaxBlocks = 132 * 16;  // grid-stride beyond ~16 blocks per H100/H200 SM
  int64_t blocks = (items + kThreads - 1) / kThreads;
  blocks = blocks > kMaxBlocks ? kMaxBlocks : blocks;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  return split12::launch_kernel(vec ? silu_mul_kernel<8> : silu_mul_kernel<1>, dim3((unsigned)blocks), kThreads, 0,
                                s, true, gate_up, rows, inter, out);
}

}  // namespace fused
}  // namespace specpilot
