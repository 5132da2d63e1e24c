// Device helpers shared by the hand-written sm_90 kernels (decode attention, the one-token GEMV,
// the skinny GEMM): programmatic dependent launch, the bf16 tensor-core mma, and the Hopper
// asynchronous pieces (mbarriers, TMA tile loads, warpgroup mma reading shared memory). (The split12
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

// Barrier `id` (1..15; 0 is __syncthreads) over the first `threads` threads of the block.
template <int id, int threads>
__device__ __forceinline__ void named_barrier_sync() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(id), "n"(threads) : "memory");
}

// Shared-memory address of a generic pointer into shared memory.
__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// mbarriers (shared::cta). A phase completes when `count` arrivals and every expected TMA byte
// have come in; wait(parity) returns once the phase of that parity has completed.
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Arrive once and expect `bytes` of TMA transactions in this phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// After mbar_init: makes the initialised barriers visible to the TMA unit (the async proxy).
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_wait(uint32_t bar, int parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// TMA: the box of a 2-D tensor map at element coordinates (c0 innermost, c1) into shared memory,
// completing `bytes` on `bar`. `map` is a __grid_constant__ kernel parameter.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void* map, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
// The same with an L2 eviction-priority hint (evict_first for data read once).
__device__ __forceinline__ void tma_load_2d_evict_first(uint32_t dst, const void* map, int c0, int c1, uint32_t bar) {
  asm volatile(
      "{\n.reg .b64 policy;\ncreatepolicy.fractional.L2::evict_first.b64 policy, 1.0;\n"
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, %3}], [%4], policy;\n}\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

// Bulk copy (1-D TMA, no tensor map): `bytes` contiguous bytes from global `src` to shared `dst`,
// completing them on `bar`. src, dst 16-byte aligned, bytes a multiple of 16. evict_first: the
// weights are read once, so they should not push x and the tables out of L2.
__device__ __forceinline__ void bulk_load_evict_first(uint32_t dst, const void* src, int bytes, uint32_t bar) {
  asm volatile(
      "{\n.reg .b64 policy;\ncreatepolicy.fractional.L2::evict_first.b64 policy, 1.0;\n"
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], policy;\n}\n" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

// Makes this thread's generic-proxy writes to shared memory visible to the async proxy (wgmma,
// TMA) once the reader has synchronised with it (e.g. through an mbarrier).
__device__ __forceinline__ void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// wgmma shared-memory descriptor of a K-major bf16 tile with 128-byte rows in the 128-byte swizzle
// that TMA writes (tile 1024-byte aligned; 8-row groups 1024 bytes apart). The k-th 16-column
// slice of the tile starts `32 * k` bytes further.
__device__ __forceinline__ uint64_t wgmma_desc_sw128(uint32_t addr) {
  return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)1 << 16 | (uint64_t)(1024 >> 4) << 32 | (uint64_t)1 << 62;
}

// d[64 x 16] += a[64 x 16] b[16 x 16]^T, both K-major in shared memory, fp32 accumulate; the
// warpgroup's 128 threads each hold 8 values of d (wgmma's m64nNk16 accumulator layout).
__device__ __forceinline__ void wgmma_m64n16k16_bf16(float d[8], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "l"(a), "l"(b));
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Keeps the compiler from moving reads or writes of an accumulator across wgmma instructions.
__device__ __forceinline__ void fence_register(float& v) { asm volatile("" : "+f"(v)::"memory"); }

}  // namespace sm90
}  // namespace specpilot
