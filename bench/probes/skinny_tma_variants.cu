// C entry points around csrc/cuda/skinny_gemm.cu for bench/probes/skinny_tma_variants.py, which
// compiles this file once per variant (the kernel's constants substituted) into a shared library
// and calls it through ctypes. Not part of the package.
#include "skinny_gemm.cu"

using namespace specpilot::skinny;

extern "C" int probe_gemm(const void* w, int n, int k, const void* x, int m, void* y, float* partials, int* counters,
                          int ctas, int pdl, void* stream) {
  SkinnyArgs a{};
  a.w = static_cast<const uint16_t*>(w);
  a.n = n;
  a.k = k;
  a.x = static_cast<const uint16_t*>(x);
  a.m = m;
  a.y = static_cast<uint16_t*>(y);
  a.partials = partials;
  a.counters = counters;
  a.ctas = ctas;
  a.pdl = pdl != 0;
  return cuda_skinny_gemm(a, stream);
}
extern "C" int probe_ctas(int n, int k) { return skinny_ctas(n, k); }
extern "C" long long probe_partials(int ctas, int n) { return skinny_partials_floats(ctas, n); }
extern "C" int probe_counters(int n) { return skinny_counters(n); }
