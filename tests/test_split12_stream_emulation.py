"""The streamed split12 GEMV (csrc/cuda/split12_stream.cu) runs on the host: g++ compiles the shipped
source against the skinny GEMM emulation's stand-ins (each GPU thread a std::thread, CTAs one after
another, mbarriers as counters, a bulk copy lands at once and completes its bytes on the barrier)
plus a shuffle through shared arrays. CPU CI then checks what the H200 run checks for real, minus
timing: the per-warp rings (slots, phases, refills), stages shorter than 2048 columns, the row
tables and escape lists loaded rows ahead, escapes in shared memory and the global fallback for a
row with more than 32, the lane-major x staging (aligned, unaligned, K % 32 != 0, the tail chunk's
-0 / +0 padding), and the output equal to cpu_split12_linear bit for bit on every row
(NaN-poisoned first). The fused prologues (cuda_split12_gemv_m1: add + RMSNorm with and without a
residual delta and its sum written by CTA 0, SiLU * mul) run the same way against a host reference
that repeats their arithmetic and summation order, then cpu_split12_linear."""
import shutil

import pytest

from conftest import run_on_host
from specpilot.settings import CSRC_DIR
from test_skinny_gemm_emulation import FUSED_BF16_CUH as SKINNY_FUSED_BF16_CUH
from test_skinny_gemm_emulation import PACK_CPP, kernel_for_host, write_stand_ins

EXTRA_DEVICE = r"""
#include <cmath>
#define __align__(n) alignas(n)
template <class T> inline T __ldg(const T* p) { return *p; }
template <class T> inline T __ldcs(const T* p) { return *p; }
inline float __uint_as_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t __float_as_uint(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
namespace emu { inline float shfl[32][32]; }
inline float __shfl_xor_sync(unsigned, float v, int off) {
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  emu::shfl[w][l] = v; __syncwarp(); const float r = emu::shfl[w][l ^ off]; __syncwarp(); return r;
}
inline float rsqrtf(float v) { return 1.0f / std::sqrt(v); }  // the GPU's is approximate: the GPU tests check its bits
namespace specpilot { namespace sm90 {
inline void bulk_load_evict_first(uint32_t dst, const void* src, int bytes, uint32_t bar) {
  std::memcpy(emu::at(dst), src, bytes);
  std::lock_guard<std::mutex> l(emu::cta->m); auto& b = emu::cta->bars.at(bar); b.tx -= bytes; emu::complete_if_done(b);
}
}}  // namespace specpilot::sm90
"""

# fused_bf16.cuh as the prologues use it (gemv_prologue.cuh): the skinny emulation's stand-in plus
# the vector and block-sum helpers, host arithmetic.
FUSED_BF16_CUH = SKINNY_FUSED_BF16_CUH + r"""
#include <cmath>
namespace specpilot { namespace fused {
inline float bf16_to_f32(uint16_t b) { const uint32_t u = (uint32_t)b << 16; float f; std::memcpy(&f, &u, 4); return f; }
inline float round_bf16(float v) { return bf16_to_f32(f32_to_bf16(v)); }
inline float silu_times(float gate, float up) { return round_bf16(gate / (1.0f + std::exp(-gate))) * up; }
inline float vec_get(const uint4& v, int i) { const uint32_t w = (&v.x)[i / 2]; return bf16_to_f32((uint16_t)(i % 2 ? w >> 16 : w & 0xFFFFu)); }
inline void vec_set(uint4& v, int i, float value) {
  uint32_t& w = (&v.x)[i / 2]; const uint32_t b = f32_to_bf16(value);
  w = i % 2 ? (w & 0x0000FFFFu) | (b << 16) : (w & 0xFFFF0000u) | b;
}
inline float warp_sum(float v) { for (int off = 16; off >= 1; off /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, off); return v; }
inline float block_sum(float v, float* scratch) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) { float w = lane < warps ? scratch[lane] : 0.0f; w = warp_sum(w); if (lane == 0) scratch[32] = w; }
  __syncthreads();
  return scratch[32];
}
}}  // namespace specpilot::fused
"""

MAIN = r"""
#include <cstdio>
#include <random>
#include <vector>
#include "fused_bf16.cuh"
#include "specpilot/gemv_m1.h"
using namespace specpilot::split12;
namespace fz = specpilot::fused;

// A warp's butterfly sum (lane 0's value), as __shfl_xor_sync gives it.
static float butterfly(std::vector<float> v) {
  for (int off = 16; off >= 1; off /= 2) {
    std::vector<float> n(32);
    for (int l = 0; l < 32; ++l) n[l] = v[l] + v[l ^ off];
    v = n;
  }
  return v[0];
}

// The prologue's `in` on the host: gemv_prologue.cuh's arithmetic and order (add_rms_norm's virtual
// block of vthreads threads, 4 vectors each, inside a 512-thread block; silu_mul elementwise).
static std::vector<uint16_t> prologue_ref(int P, int K, const uint16_t* x, const uint16_t* delta, const uint16_t* nw,
                                          float eps, std::vector<uint16_t>* sum) {
  std::vector<uint16_t> in(x, x + K);
  if (P == specpilot::gemv::kGemvPlain) return in;
  if (P == specpilot::gemv::kGemvSiluMul) {
    for (int k = 0; k < K; ++k) in[k] = fz::f32_to_bf16(fz::silu_times(fz::bf16_to_f32(x[k]), fz::bf16_to_f32(x[K + k])));
    return in;
  }
  const int kvec = K / 8;
  int vthreads = ((kvec + 1) / 2 + 31) / 32 * 32;
  vthreads = vthreads < 32 ? 32 : vthreads;
  std::vector<float> s(K), sq(512, 0.0f);
  for (int t = 0; t < vthreads; ++t)
    for (int i = 0; i < 4 && t + i * vthreads < kvec; ++i)
      for (int j = 0; j < 8; ++j) {
        const int k = 8 * (t + i * vthreads) + j;
        s[k] = delta ? fz::round_bf16(fz::bf16_to_f32(x[k]) + fz::bf16_to_f32(delta[k])) : fz::bf16_to_f32(x[k]);
        sq[t] = std::fma(s[k], s[k], sq[t]);
      }
  std::vector<float> warps(32, 0.0f);
  for (int w = 0; w < 16; ++w) warps[w] = butterfly(std::vector<float>(sq.begin() + 32 * w, sq.begin() + 32 * w + 32));
  const float rstd = 1.0f / std::sqrt(butterfly(warps) * (1.0f / (float)K) + eps);
  for (int k = 0; k < K; ++k) {
    in[k] = fz::f32_to_bf16(fz::round_bf16(s[k] * rstd) * fz::bf16_to_f32(nw[k]));
    if (sum) (*sum)[k] = fz::f32_to_bf16(s[k]);
  }
  return in;
}

""" + PACK_CPP + r"""
int main(int argc, char** argv) {
  std::mt19937 rng(std::stoul(argv[1]));
  std::normal_distribution<float> nd(0.0f, 0.02f);
  int fails = 0, cases = 0;
  // (N, K, SMs, x offset in elements): several rows per warp on 1-3 SMs (ring wrap-around, tables
  // ahead), K tails (not a multiple of 32 / 8), stages of 2048 + short, unaligned x, rings of 4
  // (K <= 15616), 3 (K = 20000) and 2 stages (the widest K).
  const int shapes[][4] = {{37, 133, 1, 0}, {40, 2085, 1, 0}, {20, 5000, 1, 0}, {64, 4096, 2, 0}, {301, 1024, 3, 0},
                           {1, 8, 1, 0}, {50, 96, 1, 1}, {33, 4100, 1, 0}, {130, 520, 1, 0}, {21, 12288, 1, 0},
                           {9, 20000, 1, 0}, {17, 64768, 1, 0}};
  for (auto& s : shapes) {
    const int N = s[0], K = s[1], offset = s[3];
    emu_sms = s[2];
    std::vector<uint16_t> w((size_t)N * K), xbuf((size_t)K + 8);
    for (auto& v : w) {
      float f = nd(rng);
      if (rng() % 500 == 0) f = (rng() % 2) ? 0.0f : 1e4f;  // escapes: most pairs keep theirs in shared memory
      v = f32_bits_to_bf16_rne(__float_as_uint(f));
    }
    for (int k = 0; k < K; k += 3) w[(size_t)(2 % N) * K + k] = 0;  // an escape-heavy row: > 32, global list
    for (auto& v : xbuf) v = f32_bits_to_bf16_rne(__float_as_uint(nd(rng) * 50));
    const uint16_t* x = xbuf.data() + offset;
    const Planes p = pack(w, N, K);
    std::vector<uint16_t> ref((size_t)N), got((size_t)N, 0x7FC0);
    cpu_split12_linear(x, 1, p.lo.data(), p.codes.data(), p.base.data(), p.rowptr.data(), p.col.data(), p.val.data(),
                       N, K, 0, N, ref.data());
    const int err = cuda_split12_stream_gemv(x, p.lo.data(), p.codes.data(), p.base.data(), p.rowptr.data(),
                                             p.col.data(), p.val.data(), N, K, got.data(), nullptr);
    int wrong = 0;
    for (int n = 0; n < N; ++n) wrong += got[n] != ref[n];
    const bool good = err == 0 && wrong == 0;
    std::printf("N=%d K=%d SMs=%d x+%d escapes=%d: %d rows differ %s\n", N, K, s[2], offset, p.rowptr[N], wrong,
                good ? "ok" : "FAIL");
    fails += !good;
    ++cases;
  }
  // The fused prologues (cuda_split12_gemv_m1): (N, K, SMs, prologue, with delta). K <= 4096 for the
  // norm; 4096 = the 8B hidden size (vthreads 256 of the 512 threads), 1024 and 2080 other blocks.
  const int fused[][5] = {{40, 4096, 2, 1, 1}, {33, 1024, 1, 1, 0}, {21, 2080, 1, 1, 1}, {37, 4096, 1, 2, 0},
                          {19, 1056, 2, 2, 0}, {24, 512, 1, 0, 0}};
  for (auto& f : fused) {
    const int N = f[0], K = f[1], P = f[3];
    const bool with_delta = f[4];
    emu_sms = f[2];
    std::vector<uint16_t> w((size_t)N * K), x((size_t)2 * K), delta(K), nw(K), sum(K, 0x7FC0), sum_ref(K);
    for (auto& v : w) v = f32_bits_to_bf16_rne(__float_as_uint(nd(rng)));
    for (int k = 0; k < 4; ++k) w[(size_t)(N - 1) * K + 7 * k] = f32_bits_to_bf16_rne(__float_as_uint(1e4f));  // escapes
    for (auto& v : x) v = f32_bits_to_bf16_rne(__float_as_uint(nd(rng) * 50));
    for (auto& v : delta) v = f32_bits_to_bf16_rne(__float_as_uint(nd(rng) * 50));
    for (auto& v : nw) v = f32_bits_to_bf16_rne(__float_as_uint(1.0f + nd(rng)));
    const Planes p = pack(w, N, K);
    const std::vector<uint16_t> in = prologue_ref(P, K, x.data(), with_delta ? delta.data() : nullptr, nw.data(), 1e-6f,
                                                  with_delta ? &sum_ref : nullptr);
    std::vector<uint16_t> ref((size_t)N), got((size_t)N, 0x7FC0);
    cpu_split12_linear(in.data(), 1, p.lo.data(), p.codes.data(), p.base.data(), p.rowptr.data(), p.col.data(),
                       p.val.data(), N, K, 0, N, ref.data());
    specpilot::gemv::GemvArgs a{};
    a.n = N; a.k = K; a.prologue = P; a.x = x.data(); a.y = got.data(); a.eps = 1e-6f;
    a.delta = with_delta ? delta.data() : nullptr;
    a.norm_w = P == specpilot::gemv::kGemvAddNorm ? nw.data() : nullptr;
    a.sum_out = with_delta ? sum.data() : nullptr;
    const Split12Planes planes{p.lo.data(), p.codes.data(), p.base.data(), p.rowptr.data(), p.col.data(),
                               reinterpret_cast<const uint16_t*>(p.val.data())};
    const int err = specpilot::gemv::cuda_split12_gemv_m1(planes, a, nullptr);
    int wrong = 0;
    for (int n = 0; n < N; ++n) wrong += got[n] != ref[n];
    if (with_delta) for (int k = 0; k < K; ++k) wrong += sum[k] != sum_ref[k];
    const bool good = err == 0 && wrong == 0;
    std::printf("fused N=%d K=%d SMs=%d prologue=%d delta=%d: %d values differ %s\n", N, K, f[2], P, f[4], wrong,
                good ? "ok" : "FAIL");
    fails += !good;
    ++cases;
  }
  // Too wide for x beside the ring: refused, so the caller uses the register-fed kernel.
  const bool refused = !split12_stream_gemv_fits(64769) && split12_stream_gemv_fits(64768);
  std::printf("refuses K=64769 %s\n", refused ? "ok" : "FAIL");
  fails += !refused;
  std::printf("cases %d\n", cases + 1);
  return fails ? 1 : 0;
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed on this machine")
def test_stream_gemv_on_the_host(tmp_path):
    write_stand_ins(tmp_path, EXTRA_DEVICE)
    cuda_dir = CSRC_DIR / "cuda"
    (tmp_path / "fused_bf16.cuh").write_text(FUSED_BF16_CUH)
    for name in ("split12_kernel.cuh", "gemv_prologue.cuh"):
        (tmp_path / name).write_text((cuda_dir / name).read_text())
    (tmp_path / "split12_stream.cpp").write_text(
        kernel_for_host(cuda_dir / "split12_stream.cu", "extern __shared__ __align__(128) uint8_t smem[];", "smem"))
    (tmp_path / "main.cpp").write_text('#include "split12_launch.h"\n#include "specpilot/split12_format.h"\n' + MAIN)
    sources = [tmp_path / "main.cpp", tmp_path / "split12_stream.cpp", CSRC_DIR / "cpu" / "split12_pack.cpp",
               CSRC_DIR / "cpu" / "split12_linear.cpp"]
    out = run_on_host(tmp_path / "emulation", sources, [tmp_path, CSRC_DIR / "include"], timeout=600)
    cases = int(out.split("cases ")[-1])
    assert cases == 12 + 6 + 1 and out.count(" ok\n") == cases, out
