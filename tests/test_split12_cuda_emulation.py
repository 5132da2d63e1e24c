"""The CUDA kernel bodies of split12 run on the host: g++ compiles csrc/cuda/split12_kernel.cuh
and (lightly rewritten) split12_tc.cu against small shims where each GPU thread is a std::thread
meeting at barriers for shuffles, __syncwarp/__syncthreads and an emulated mma.m16n8k16 (PTX
fragment layout, fp64 sums). CPU CI then checks the indexing, escape cursors, tails and fragment
mapping that the H200 run checks for real:
  CUDA-core kernel == cpu_split12_linear bit for bit (split12 and bf16 sources, aligned / not,
  every rows-per-warp R / chunks-in-flight U the launchers use);
  tensor-core kernel: split12 == bf16 bit for bit, within rounding of the CPU result."""
import shutil

import pytest

from conftest import run_on_host
from specpilot.settings import CSRC_DIR

SHIM = r"""
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#define __device__
#define __forceinline__ inline
#define __global__
#define __launch_bounds__(...)
#define __shared__ static
struct uint4 { uint32_t x, y, z, w; };
struct Dim { unsigned x; };
thread_local Dim threadIdx;
Dim blockIdx;
template <class T> inline T __ldg(const T* p) { return *p; }
template <class T> inline T __ldcs(const T* p) { return *p; }
inline float __uint_as_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t __float_as_uint(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
struct Barrier {
  int size, count = 0, gen = 0; std::mutex m; std::condition_variable cv;
  explicit Barrier(int n) : size(n) {}
  void wait() { std::unique_lock<std::mutex> l(m); int g = gen;
    if (++count == size) { count = 0; ++gen; cv.notify_all(); } else cv.wait(l, [&] { return g != gen; }); }
};
Barrier* g_block_bar; Barrier* g_warp_bar[8];
float g_shfl[8][32]; uint32_t g_a[8][32][4], g_b[8][32][2];
inline void __syncthreads() { g_block_bar->wait(); }
inline void __syncwarp() { g_warp_bar[threadIdx.x / 32]->wait(); }
inline float __shfl_xor_sync(unsigned, float v, int off) {
  const int w = threadIdx.x / 32, lane = threadIdx.x & 31;
  g_shfl[w][lane] = v; g_warp_bar[w]->wait(); const float r = g_shfl[w][lane ^ off]; g_warp_bar[w]->wait(); return r;
}
inline float bf(uint32_t pair, int half) { return __uint_as_float(half ? (pair & 0xFFFF0000u) : (pair << 16)); }
// mma.m16n8k16 row.col bf16: A regs {a0a1, a2a3, a4a5, a6a7} = rows g / g+8, k 2t.. / 2t+8..;
// B regs {b0b1, b2b3} = k 2t.. / 2t+8.., column g; C {c0..c3} = rows g, g, g+8, g+8 x columns 2t, 2t+1.
inline void mma_emul(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
  const int w = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const uint32_t a[4] = {a0, a1, a2, a3};
  for (int i = 0; i < 4; ++i) g_a[w][lane][i] = a[i];
  g_b[w][lane][0] = b0; g_b[w][lane][1] = b1;
  g_warp_bar[w]->wait();
  auto A = [&](int r, int k) { return bf(g_a[w][(r % 8) * 4 + (k % 8) / 2][(r < 8 ? 0 : 1) + (k < 8 ? 0 : 2)], k & 1); };
  auto B = [&](int k, int n) { return bf(g_b[w][n * 4 + (k % 8) / 2][k < 8 ? 0 : 1], k & 1); };
  const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
  float d[4];
  for (int i = 0; i < 4; ++i) { double s = c[i]; for (int k = 0; k < 16; ++k) s += (double)A(rows[i], k) * B(k, cols[i]); d[i] = (float)s; }
  g_warp_bar[w]->wait();
  for (int i = 0; i < 4; ++i) c[i] = d[i];
}
"""

MAIN = r"""
#include <cstdio>
#include <random>
#include <thread>
#include <vector>
using namespace specpilot::split12;

struct Packed { std::vector<uint8_t> lo, codes, base; std::vector<int32_t> rowptr, col; std::vector<int16_t> val; };
Packed pack(const std::vector<uint16_t>& w, int64_t N, int64_t K) {
  Packed p; const int64_t kpad = round_up_kpad(K); std::vector<int32_t> count(N); p.base.resize(N);
  cpu_choose_bases(w.data(), N, K, p.base.data(), count.data());
  p.rowptr.assign(N + 1, 0);
  for (int64_t n = 0; n < N; ++n) p.rowptr[n + 1] = p.rowptr[n] + count[n];
  p.lo.resize(N * kpad); p.codes.resize(N * kpad / 2); p.col.resize(p.rowptr[N]); p.val.resize(p.rowptr[N]);
  cpu_pack(w.data(), N, K, p.base.data(), p.rowptr.data(), p.lo.data(), p.codes.data(), p.col.data(), p.val.data());
  return p;
}
void run_threads(int n, const std::function<void(int)>& body) {
  Barrier block(n); g_block_bar = &block;
  std::vector<Barrier*> warps;
  for (int i = 0; i < 8; ++i) g_warp_bar[i] = new Barrier(32);
  std::vector<std::thread> ts;
  for (int i = 0; i < n; ++i) ts.emplace_back([&, i] { threadIdx.x = i; body(i); });
  for (auto& t : ts) t.join();
  for (int i = 0; i < 8; ++i) delete g_warp_bar[i];
}
template <class Src, int MT, int R, int U = 1>
void simt(const Src& src, const uint16_t* x, int M, uint16_t* y, int N, int K, bool xvec) {
  for (int row0 = 0; row0 < N; row0 += R)
    run_threads(32, [&](int) { linear_warp<Src, MT, R, U>(src, x, M, y, N, K, row0, xvec); });
}
template <class Src, int NT>
void tc(const Src& src, const uint16_t* x, int M, uint16_t* y, int N, int K, bool xvec) {
  for (int b = 0; b < (N + 15) / 16; ++b) {
    blockIdx.x = b;
    run_threads(256, [&](int) { tcemu::tc_linear_kernel<Src, NT>(src, x, M, y, N, K, xvec); });
  }
}
int main(int argc, char** argv) {
  std::mt19937 rng(std::stoul(argv[1]));
  std::normal_distribution<float> nd(0.0f, 0.02f);
  int fails = 0;
  // K = 5000: 40 spans; lanes hold 4-5 chunks (U batches).
  const int shapes[][3] = {{37, 133, 1}, {37, 133, 3}, {37, 133, 16}, {9, 2085, 1}, {9, 2085, 16}, {5, 1, 2},
                           {20, 1024, 32}, {6, 5000, 1}, {6, 5000, 12}};
  const int nshapes = sizeof(shapes) / sizeof(shapes[0]);
  for (auto& s : shapes) {
    const int N = s[0], K = s[1], M = s[2];
    std::vector<uint16_t> w(N * K), x(M * K);
    for (auto& v : w) { float f = nd(rng); if (rng() % 40 == 0) f = (rng() % 2) ? 0.0f : 1e4f; v = f32_bits_to_bf16_rne(__float_as_uint(f)); }
    for (int k = 0; k < K; k += 3) w[(2 % N) * K + k] = 0;  // an escape-heavy row
    for (auto& v : x) v = f32_bits_to_bf16_rne(__float_as_uint(nd(rng) * 50));
    const Packed p = pack(w, N, K);
    const Split12Source s12{{p.lo.data(), p.codes.data(), p.base.data(), p.rowptr.data(), p.col.data(),
                             (const uint16_t*)p.val.data()}, (int)round_up_kpad(K)};
    const Bf16Source b16{w.data(), K, K % 8 == 0};
    const bool xvec = K % 8 == 0;
    const std::vector<uint16_t> nan(M * N, 0x7FC0);
    std::vector<uint16_t> ref(M * N), a = nan, b = nan, c = nan, t1 = nan, t2 = nan;
    cpu_split12_linear(x.data(), M, p.lo.data(), p.codes.data(), p.base.data(), p.rowptr.data(), p.col.data(),
                       p.val.data(), N, K, 0, N, ref.data());
    if (M <= 16) {  // the launcher's buckets: MT >= M
      simt<Split12Source, 16, 2>(s12, x.data(), M, a.data(), N, K, xvec);
      simt<Bf16Source, 16, 2>(b16, x.data(), M, b.data(), N, K, xvec);
    } else {
      simt<Split12Source, 32, 1>(s12, x.data(), M, a.data(), N, K, xvec);
      simt<Bf16Source, 32, 1>(b16, x.data(), M, b.data(), N, K, xvec);
    }
    simt<Split12Source, 32, 1>(s12, x.data(), M, c.data(), N, K, false);  // the unaligned-x path
    // The latency-hiding CUDA-core variants (the M = 1 launchers' R / U, here for every M): same bits.
    bool unrolled_ok = true;
    auto expect_ref = [&](const std::vector<uint16_t>& got) { unrolled_ok = unrolled_ok && got == ref; };
    if (M <= 16) {
      std::vector<uint16_t> u = nan; simt<Split12Source, 16, 1, 4>(s12, x.data(), M, u.data(), N, K, xvec); expect_ref(u);
      u = nan; simt<Split12Source, 16, 1, 2>(s12, x.data(), M, u.data(), N, K, xvec); expect_ref(u);
      u = nan; simt<Split12Source, 16, 2, 2>(s12, x.data(), M, u.data(), N, K, xvec); expect_ref(u);
      u = nan; simt<Bf16Source, 16, 1, 4>(b16, x.data(), M, u.data(), N, K, xvec); expect_ref(u);
      u = nan; simt<Bf16Source, 16, 2, 2>(b16, x.data(), M, u.data(), N, K, xvec); expect_ref(u);
      u = nan; simt<Split12Source, 16, 1, 4>(s12, x.data(), M, u.data(), N, K, false); expect_ref(u);
    }
    tc<Split12Source, 4>(s12, x.data(), M, t1.data(), N, K, xvec);
    tc<Bf16Source, 4>(b16, x.data(), M, t2.data(), N, K, xvec);
    double worst = 0;  // tensor cores vs the CPU: a few ulps of fp32 on the row's magnitude + bf16 rounding
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) {
        double mag = 0;
        for (int k = 0; k < K; ++k) mag += std::fabs((double)bf(x[m * K + k], 0) * bf(w[n * K + k], 0));
        const double got = bf(t1[m * N + n], 0), want = bf(ref[m * N + n], 0);
        worst = std::max(worst, std::fabs(got - want) / (std::fabs(want) / 128.0 + mag * 1e-6 + 1e-37));
      }
    const bool ok = a == ref && b == ref && c == ref && unrolled_ok && t1 == t2 && worst <= 1.0;
    std::printf("N=%d K=%d M=%d escapes=%d simt=%d/%d/%d unrolled=%d tc_twin=%d tc_err/tol=%.3f %s\n",
                N, K, M, p.rowptr[N], a == ref, b == ref, c == ref, unrolled_ok, t1 == t2, worst,
                ok ? "ok" : "FAIL");
    fails += !ok;
  }
  std::printf("shapes %d\n", nshapes);
  return fails ? 1 : 0;
}
"""


def tc_kernel_for_host(path) -> str:
    """split12_tc.cu with the mma asm replaced by the emulation and the host launchers dropped."""
    src = path.read_text()
    start, end = src.index("__device__ __forceinline__ void mma_bf16"), src.index("// Zero the columns")
    src = (src[:start] + "inline void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, "
           "uint32_t b0, uint32_t b1) { mma_emul(c, a0, a1, a2, a3, b0, b1); }\n\n" + src[end:])
    src = src[:src.index("template <class Source>\nint launch_tc")] + "}  // namespace tcemu\n}  // namespace split12\n}  // namespace specpilot\n"
    src = src.replace("#include <cuda_runtime.h>", "").replace('#include "split12_launch.h"', "").replace("namespace {\n\nconstexpr int kWarps", "namespace tcemu {\n\nconstexpr int kWarps")
    return src


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed on this machine")
def test_cuda_kernel_bodies_on_the_host(tmp_path):
    cuda_dir = CSRC_DIR / "cuda"
    source = tmp_path / "emulation.cpp"
    source.write_text("#include <functional>\n" + SHIM + f'#include "{cuda_dir / "split12_kernel.cuh"}"\n'
                      + tc_kernel_for_host(cuda_dir / "split12_tc.cu") + MAIN)
    out = run_on_host(tmp_path / "emulation",
                      [source, CSRC_DIR / "cpu" / "split12_pack.cpp", CSRC_DIR / "cpu" / "split12_linear.cpp"],
                      [CSRC_DIR / "include", cuda_dir])
    shapes = int(out.split("shapes ")[-1])
    assert shapes == 9 and out.count(" ok\n") == shapes, out
