// C entry points around csrc/cuda/split12_stream.cu for bench/probes/split12_stream_timeline.py,
// which compiles this file once per variant into a shared library: the kernel's source with its
// constants substituted and PROBE_* stamps inserted at fixed places (the script checks each place
// exists). With a trace buffer set, every CTA writes one record (kRecord u64s):
//   0 weight pointer (which launch), 1 smid << 32 | blockIdx.x,
//   2 start, 3 after griddepcontrol.wait, 4 x staged, 5 warp 0's first stage landed, 6 last warp done
//     (%globaltimer, ns),
//   8 .. 11 the same four after-start marks in SM clock cycles since the CTA's start (clock64).
// Without a buffer the stamps cost one global load and a branch. Not part of the package.
#include <cstdint>

constexpr int kRecord = 16;
__device__ unsigned long long* g_trace = nullptr;
__device__ unsigned int g_capacity = 0;
__device__ unsigned int g_next = 0;

__device__ __forceinline__ unsigned long long probe_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ unsigned int probe_smid() {
  unsigned int s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}

// Thread 0 takes a record; the other warps read its address after the kernel's x barrier.
#define PROBE_START()                                                                              \
  __shared__ unsigned long long* probe_rec;                                                        \
  __shared__ long long probe_clk0;                                                                 \
  if (threadIdx.x == 0) {                                                                          \
    probe_clk0 = clock64();                                                                        \
    probe_rec = nullptr;                                                                           \
    if (g_trace != nullptr) {                                                                      \
      const unsigned int i = atomicAdd(&g_next, 1u);                                               \
      if (i < g_capacity) {                                                                        \
        probe_rec = g_trace + (unsigned long long)kRecord * i;                                     \
        probe_rec[0] = (unsigned long long)a.w.lo;                                                 \
        probe_rec[1] = ((unsigned long long)probe_smid() << 32) | blockIdx.x;                      \
        probe_rec[2] = probe_now();                                                                \
      }                                                                                            \
    }                                                                                              \
  }

#define PROBE_MARK(i)                                                                              \
  if (threadIdx.x == 0 && probe_rec != nullptr) {                                                  \
    probe_rec[i] = probe_now();                                                                    \
    probe_rec[(i) + 5] = (unsigned long long)(clock64() - probe_clk0);                             \
  }

#define PROBE_END()                                                                                \
  if (threadIdx.x % 32 == 0 && probe_rec != nullptr) {                                             \
    atomicMax(probe_rec + 6, probe_now());                                                         \
    atomicMax(probe_rec + 11, (unsigned long long)(clock64() - probe_clk0));                       \
  }

#include "split12_stream.cu"

extern "C" int probe_set_trace(void* buffer, unsigned int capacity) {
  const unsigned int zero = 0;
  int err = (int)cudaMemcpyToSymbol(g_trace, &buffer, sizeof(buffer));
  if (!err) err = (int)cudaMemcpyToSymbol(g_capacity, &capacity, sizeof(capacity));
  if (!err) err = (int)cudaMemcpyToSymbol(g_next, &zero, sizeof(zero));
  return err;
}

extern "C" int probe_gemv(const void* const* planes, int n, int k, const void* x, void* y, void* stream) {
  return specpilot::split12::cuda_split12_stream_gemv(
      static_cast<const uint16_t*>(x), static_cast<const uint8_t*>(planes[0]), static_cast<const uint8_t*>(planes[1]),
      static_cast<const uint8_t*>(planes[2]), static_cast<const int32_t*>(planes[3]),
      static_cast<const int32_t*>(planes[4]), static_cast<const int16_t*>(planes[5]), n, k,
      static_cast<uint16_t*>(y), stream);
}
