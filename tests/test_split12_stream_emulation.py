"""The streamed split12 GEMV (csrc/cuda/split12_stream.cu) runs on the host: g++ compiles the shipped
source against the skinny GEMM emulation's stand-ins (each GPU thread a std::thread, CTAs one after
another, mbarriers as counters, a bulk copy lands at once and completes its bytes on the barrier)
plus a shuffle through shared arrays. CPU CI then checks what the H200 run checks for real, minus
timing: the per-warp rings (slots, phases, refills), stages shorter than 2048 columns, the row
tables and escape lists loaded rows ahead, escapes in shared memory and the global fallback for a
row with more than 32, the lane-major x staging (aligned, unaligned, K % 32 != 0, the tail chunk's
-0 / +0 padding), and the output equal to cpu_split12_linear bit for bit on every row
(NaN-poisoned first)."""
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
namespace specpilot { namespace sm90 {
inline void bulk_load_evict_first(uint32_t dst, const void* src, int bytes, uint32_t bar) {
  std::memcpy(emu::at(dst), src, bytes);
  std::lock_guard<std::mutex> l(emu::cta->m); auto& b = emu::cta->bars.at(bar); b.tx -= bytes; emu::complete_if_done(b);
}
}}  // namespace specpilot::sm90
"""

MAIN = r"""
#include <cstdio>
#include <random>
#include <vector>
using namespace specpilot::split12;

""" + PACK_CPP + r"""
int main(int argc, char** argv) {
  std::mt19937 rng(std::stoul(argv[1]));
  std::normal_distribution<float> nd(0.0f, 0.02f);
  int fails = 0, cases = 0;
  // (N, K, SMs, x offset in elements): several rows per warp on 1-3 SMs (ring wrap-around, tables
  // ahead), K tails (not a multiple of 32 / 8), stages of 2048 + short, unaligned x, the widest K.
  const int shapes[][4] = {{37, 133, 1, 0}, {40, 2085, 1, 0}, {20, 5000, 1, 0}, {64, 4096, 2, 0}, {301, 1024, 3, 0},
                           {1, 8, 1, 0}, {50, 96, 1, 1}, {33, 4100, 1, 0}, {130, 520, 1, 0}, {21, 12288, 1, 0},
                           {9, 20000, 1, 0}, {17, 64896, 1, 0}};
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
  // Too wide for x beside the ring: refused, so the caller uses the register-fed kernel.
  const bool refused = !split12_stream_gemv_fits(64897) && split12_stream_gemv_fits(64896);
  std::printf("refuses K=64897 %s\n", refused ? "ok" : "FAIL");
  fails += !refused;
  std::printf("cases %d\n", cases + 1);
  return fails ? 1 : 0;
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed on this machine")
def test_stream_gemv_on_the_host(tmp_path):
    write_stand_ins(tmp_path, EXTRA_DEVICE)
    cuda_dir = CSRC_DIR / "cuda"
    (tmp_path / "fused_bf16.cuh").write_text(SKINNY_FUSED_BF16_CUH)
    (tmp_path / "split12_kernel.cuh").write_text((cuda_dir / "split12_kernel.cuh").read_text())
    (tmp_path / "split12_stream.cpp").write_text(
        kernel_for_host(cuda_dir / "split12_stream.cu", "extern __shared__ __align__(128) uint8_t smem[];", "smem"))
    (tmp_path / "main.cpp").write_text('#include "split12_launch.h"\n#include "specpilot/split12_format.h"\n' + MAIN)
    sources = [tmp_path / "main.cpp", tmp_path / "split12_stream.cpp", CSRC_DIR / "cpu" / "split12_pack.cpp",
               CSRC_DIR / "cpu" / "split12_linear.cpp"]
    out = run_on_host(tmp_path / "emulation", sources, [tmp_path, CSRC_DIR / "include"], timeout=600)
    cases = int(out.split("cases ")[-1])
    assert cases == 12 + 1 and out.count(" ok\n") == cases, out
