// y = x @ W.T on the CPU for split12 and plain bf16 weights, in the reduction order of
// split12_format.h (32 lanes of 32-column chunks, fmaf chains, then a butterfly tree), so the
// two are bit-identical to each other and to the CUDA kernels. Torch-free; the binding splits
// rows [n0, n1) across threads.
#include <cmath>
#include <cstring>
#include <vector>

#include "specpilot/split12_format.h"

namespace specpilot {
namespace split12 {

namespace {

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// One output: the lane chains over w_row / x_row (fp32 copies of bf16 values) and the tree.
// Hardware FMA where the CPU has it; std::fma is correctly rounded either way.
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
__attribute__((target_clones("fma", "default")))
#endif
float reduce_row(const float* x_row, const float* w_row, int64_t K) {
  float acc[kLanes];
  for (int l = 0; l < kLanes; ++l) {
    float a = 0.0f;
    for (int64_t c0 = (int64_t)l * kChunk; c0 < K; c0 += (int64_t)kLanes * kChunk) {
      const int64_t c1 = c0 + kChunk < K ? c0 + kChunk : K;
      for (int64_t k = c0; k < c1; ++k) a = std::fma(x_row[k], w_row[k], a);
    }
    acc[l] = a;
  }
  for (int off = kLanes / 2; off >= 1; off /= 2)
    for (int l = 0; l < off; ++l) acc[l] = acc[l] + acc[l + off];
  return acc[0];
}

std::vector<float> x_to_float(const uint16_t* x, int64_t M, int64_t K) {
  std::vector<float> xf((size_t)(M * K));
  for (int64_t i = 0; i < M * K; ++i) xf[(size_t)i] = bits_to_float((uint32_t)x[i] << 16);
  return xf;
}

void rows_times_x(const std::vector<float>& xf, int64_t M, const float* w_row, int64_t n, int64_t N,
                  int64_t K, uint16_t* y) {
  for (int64_t m = 0; m < M; ++m)
    y[m * N + n] = f32_bits_to_bf16_rne(float_to_bits(reduce_row(xf.data() + m * K, w_row, K)));
}

}  // namespace

void cpu_split12_linear(const uint16_t* x, int64_t M, const uint8_t* lo, const uint8_t* codes,
                        const uint8_t* base, const int32_t* esc_rowptr, const int32_t* esc_col,
                        const int16_t* esc_val, int64_t N, int64_t K, int64_t n0, int64_t n1, uint16_t* y) {
  const int64_t kpad = round_up_kpad(K);
  const std::vector<float> xf = x_to_float(x, M, K);
  std::vector<float> w_row((size_t)K);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* lo_row = lo + n * kpad;
    const uint8_t* code_row = codes + n * (kpad / 2);
    for (int64_t k = 0; k < K; ++k) {
      const uint32_t code = (code_row[code_byte(k)] >> code_shift(k)) & 0xFu;
      w_row[(size_t)k] = bits_to_float((uint32_t)decode_one(code, lo_row[k], base[n]) << 16);
    }
    for (int32_t e = esc_rowptr[n]; e < esc_rowptr[n + 1]; ++e)  // in place: same position, same order
      w_row[(size_t)esc_col[e]] = bits_to_float((uint32_t)(uint16_t)esc_val[e] << 16);
    rows_times_x(xf, M, w_row.data(), n, N, K, y);
  }
}

void cpu_bf16_linear(const uint16_t* x, int64_t M, const uint16_t* w, int64_t N, int64_t K, int64_t n0,
                     int64_t n1, uint16_t* y) {
  const std::vector<float> xf = x_to_float(x, M, K);
  std::vector<float> w_row((size_t)K);
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t k = 0; k < K; ++k) w_row[(size_t)k] = bits_to_float((uint32_t)w[n * K + k] << 16);
    rows_times_x(xf, M, w_row.data(), n, N, K, y);
  }
}

}  // namespace split12
}  // namespace specpilot
