// split12 pack / unpack on the CPU (torch-free). Bit-exact: unpack(pack(w)) == w for every bf16
// bit pattern, and the planes equal python/specpilot/formats/split12/reference.py's byte for byte.
#include <cstring>
#include <stdexcept>
#include <string>

#include "specpilot/split12_format.h"

namespace specpilot {
namespace split12 {

namespace {

inline uint32_t half_exponent(uint16_t bits) { return (bits >> 8) & 0x7Fu; }  // e >> 1

// The base whose 8 classes hold the most weights of the row (first such base on ties).
uint8_t best_base(const uint16_t* row, int64_t K, int64_t* inside) {
  int64_t hist[128] = {0};
  for (int64_t k = 0; k < K; ++k) ++hist[half_exponent(row[k])];
  int64_t window = 0;
  for (int h = 0; h < 8; ++h) window += hist[h];
  int64_t best = window;
  int best_b = 0;
  for (int b = 1; b <= kMaxBase; ++b) {
    window += hist[b + 7] - hist[b - 1];
    if (window > best) {
      best = window;
      best_b = b;
    }
  }
  *inside = best;
  return (uint8_t)best_b;
}

}  // namespace

void cpu_choose_bases(const uint16_t* w, int64_t N, int64_t K, uint8_t* base, int32_t* esc_count) {
  for (int64_t n = 0; n < N; ++n) {
    int64_t inside = 0;
    base[n] = best_base(w + n * K, K, &inside);
    esc_count[n] = (int32_t)(K - inside);
  }
}

void cpu_pack(const uint16_t* w, int64_t N, int64_t K, const uint8_t* base, const int32_t* esc_rowptr,
              uint8_t* lo, uint8_t* codes, int32_t* esc_col, int16_t* esc_val) {
  const int64_t kpad = round_up_kpad(K);
  for (int64_t n = 0; n < N; ++n) {
    const uint16_t* row = w + n * K;
    uint8_t* lo_row = lo + n * kpad;
    uint8_t* code_row = codes + n * (kpad / 2);
    std::memset(lo_row, 0, (size_t)kpad);  // padding columns: lo = 0, code = 0
    std::memset(code_row, 0, (size_t)(kpad / 2));
    int64_t e = esc_rowptr[n];
    for (int64_t k = 0; k < K; ++k) {
      const uint16_t bits = row[k];
      const uint32_t sign = bits >> 15;
      const int32_t cls = (int32_t)half_exponent(bits) - (int32_t)base[n];
      uint32_t code = sign << 3;
      if (cls >= 0 && cls <= 7) {
        code |= (uint32_t)cls;
      } else {  // escape: code keeps the sign with class 0, the full pattern goes to the table
        esc_col[e] = (int32_t)k;
        esc_val[e] = (int16_t)bits;
        ++e;
      }
      lo_row[k] = (uint8_t)(bits & 0xFFu);
      code_row[code_byte(k)] |= (uint8_t)(code << code_shift(k));
    }
    if (e != esc_rowptr[n + 1])
      throw std::runtime_error("split12 pack: row " + std::to_string(n) + " has " +
                               std::to_string(e - esc_rowptr[n]) + " escapes but esc_rowptr says " +
                               std::to_string(esc_rowptr[n + 1] - esc_rowptr[n]));
  }
}

void cpu_unpack(const uint8_t* lo, const uint8_t* codes, const uint8_t* base, const int32_t* esc_rowptr,
                const int32_t* esc_col, const int16_t* esc_val, int64_t N, int64_t K, uint16_t* w) {
  const int64_t kpad = round_up_kpad(K);
  for (int64_t n = 0; n < N; ++n) {
    const uint8_t* lo_row = lo + n * kpad;
    const uint8_t* code_row = codes + n * (kpad / 2);
    uint16_t* out = w + n * K;
    for (int64_t k = 0; k < K; ++k) {
      const uint32_t code = (code_row[code_byte(k)] >> code_shift(k)) & 0xFu;
      out[k] = decode_one(code, lo_row[k], base[n]);
    }
    const int32_t begin = esc_rowptr[n], end = esc_rowptr[n + 1];
    if (begin > end)
      throw std::runtime_error("split12 unpack: esc_rowptr decreases at row " + std::to_string(n) + " (" +
                               std::to_string(begin) + " > " + std::to_string(end) + ")");
    for (int32_t e = begin; e < end; ++e) {
      const int32_t k = esc_col[e];
      if (k < 0 || k >= K)
        throw std::runtime_error("split12 unpack: escape column " + std::to_string(k) + " of row " +
                                 std::to_string(n) + " is outside [0, K=" + std::to_string(K) + ")");
      out[k] = (uint16_t)esc_val[e];
    }
  }
}

}  // namespace split12
}  // namespace specpilot
