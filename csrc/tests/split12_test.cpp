// Torch-free round-trip test of the split12 CPU kernels (ctest target): pack -> unpack is
// bit-exact for random and special bf16 patterns, and split12 / bf16 linear agree bit for bit.
// Build: g++ -std=c++17 -O2 -I csrc/include csrc/tests/split12_test.cpp csrc/cpu/split12_*.cpp
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "specpilot/split12_format.h"

using namespace specpilot::split12;

namespace {

struct Packed {
  std::vector<uint8_t> lo, codes, base;
  std::vector<int32_t> rowptr, col;
  std::vector<int16_t> val;
};

Packed pack(const std::vector<uint16_t>& w, int64_t N, int64_t K) {
  Packed p;
  const int64_t kpad = round_up_kpad(K);
  std::vector<int32_t> count(N);
  p.base.resize(N);
  cpu_choose_bases(w.data(), N, K, p.base.data(), count.data());
  p.rowptr.assign(N + 1, 0);
  for (int64_t n = 0; n < N; ++n) p.rowptr[n + 1] = p.rowptr[n] + count[n];
  p.lo.resize(N * kpad);
  p.codes.resize(N * kpad / 2);
  p.col.resize(p.rowptr[N]);
  p.val.resize(p.rowptr[N]);
  cpu_pack(w.data(), N, K, p.base.data(), p.rowptr.data(), p.lo.data(), p.codes.data(), p.col.data(), p.val.data());
  return p;
}

int check(bool ok, const char* what, int64_t N, int64_t K) {
  if (!ok) std::printf("FAIL %s (N=%lld K=%lld)\n", what, (long long)N, (long long)K);
  return ok ? 0 : 1;
}

}  // namespace

int main() {
  std::mt19937 rng(std::random_device{}());
  const uint16_t specials[] = {0x0000, 0x8000, 0x0001, 0x807F, 0x7F80, 0xFF80, 0x7FC0, 0xFFFF, 0x7FA5, 0x3F80};
  int failures = 0;
  const int64_t shapes[][2] = {{1, 1}, {7, 33}, {37, 133}, {16, 1024}, {3, 2085}, {256, 256}};
  for (const auto& s : shapes) {
    const int64_t N = s[0], K = s[1];
    std::vector<uint16_t> w(N * K);
    std::normal_distribution<float> normal(0.0f, 0.02f);
    for (int64_t i = 0; i < N * K; ++i) {
      float f = normal(rng);
      uint32_t u;
      std::memcpy(&u, &f, 4);
      w[i] = f32_bits_to_bf16_rne(u);
      if (rng() % 20 == 0) w[i] = specials[rng() % 10];
      if (N * K == 65536) w[i] = (uint16_t)i;  // every bf16 pattern once
    }
    const Packed p = pack(w, N, K);
    std::vector<uint16_t> back(N * K);
    cpu_unpack(p.lo.data(), p.codes.data(), p.base.data(), p.rowptr.data(), p.col.data(), p.val.data(), N, K,
               back.data());
    failures += check(back == w, "unpack(pack(w)) == w", N, K);

    // Linear: finite weights only (NaN payloads need not survive arithmetic).
    for (auto& v : w)
      if (((v >> 7) & 0xFF) == 0xFF) v = 0x3C00;
    const Packed q = pack(w, N, K);
    const int64_t M = 3;
    std::vector<uint16_t> x(M * K), y12(M * N, 0x7FC0), y16(M * N, 0x7FC0);
    for (auto& v : x) v = (uint16_t)(0x3C00 + rng() % 0x0200) | (uint16_t)((rng() & 1) << 15);
    cpu_split12_linear(x.data(), M, q.lo.data(), q.codes.data(), q.base.data(), q.rowptr.data(), q.col.data(),
                       q.val.data(), N, K, 0, N, y12.data());
    cpu_bf16_linear(x.data(), M, w.data(), N, K, 0, N, y16.data());
    failures += check(y12 == y16, "split12 linear == bf16 linear", N, K);
  }
  std::printf(failures ? "split12_test: %d failures\n" : "split12_test: all passed\n", failures);
  return failures ? 1 : 0;
}
