// bf16 helpers shared by the fused elementwise kernels: bit patterns <-> fp32, 16-byte vectors
// of 8 bf16, and the warp / block fp32 sums of the RMSNorms.
// Rounding: fp32 -> bf16 is round-to-nearest-even (__float2bfloat16_rn), as torch's bf16 casts.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace specpilot {
namespace fused {

__device__ __forceinline__ float bf16_to_f32(uint16_t bits) { return __uint_as_float((uint32_t)bits << 16); }

__device__ __forceinline__ uint16_t f32_to_bf16(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }

// Round to bf16 and back: the value a bf16 tensor op would store.
__device__ __forceinline__ float round_bf16(float v) { return bf16_to_f32(f32_to_bf16(v)); }

// The SwiGLU gate of one element: bf16(silu(gate)) * up in fp32, silu(g) = g / (1 + expf(-g)) (torch's
// bf16 silu: the fp32 expression rounded to bf16). The caller rounds the product to bf16.
__device__ __forceinline__ float silu_times(float gate, float up) {
  return round_bf16(gate / (1.0f + expf(-gate))) * up;
}

// 8 bf16 of a uint4 (16-byte vector), element i in half i % 2 of word i / 2 (little-endian memory order).
__device__ __forceinline__ float vec_get(const uint4& v, int i) {
  const uint32_t w = (&v.x)[i / 2];
  return bf16_to_f32((uint16_t)(i % 2 ? w >> 16 : w & 0xFFFFu));
}

__device__ __forceinline__ void vec_set(uint4& v, int i, float value) {
  uint32_t& w = (&v.x)[i / 2];
  const uint32_t b = f32_to_bf16(value);
  w = i % 2 ? (w & 0x0000FFFFu) | (b << 16) : (w & 0xFFFF0000u) | b;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off >= 1; off /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, off);
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
// `scratch` holds 33 floats of shared memory.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float w = lane < warps ? scratch[lane] : 0.0f;
    w = warp_sum(w);
    if (lane == 0) scratch[32] = w;
  }
  __syncthreads();
  return scratch[32];
}

}  // namespace fused
}  // namespace specpilot
