// C entry point around csrc/cuda/split12_skinny.cu for bench/probes/split12_skinny_variants.py,
// which compiles this file once per variant (the ring constants substituted) into a shared library
// and calls it through ctypes. Not part of the package.
#include "split12_skinny.cu"

using namespace specpilot::skinny;

extern "C" int probe_gemm(const void* const* planes, int n, int k, const void* x, int m, void* y, float* partials,
                          int* counters, int ctas, int pdl, void* stream) {
  Split12SkinnyArgs a{};
  a.planes = {static_cast<const uint8_t*>(planes[0]), static_cast<const uint8_t*>(planes[1]),
              static_cast<const uint8_t*>(planes[2]), static_cast<const int32_t*>(planes[3]),
              static_cast<const int32_t*>(planes[4]), static_cast<const uint16_t*>(planes[5])};
  a.n = n;
  a.k = k;
  a.x = static_cast<const uint16_t*>(x);
  a.m = m;
  a.y = static_cast<uint16_t*>(y);
  a.partials = partials;
  a.counters = counters;
  a.ctas = ctas;
  a.pdl = pdl != 0;
  return cuda_split12_skinny_gemm(a, stream);
}
