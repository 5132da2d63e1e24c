"""The GDN fused ops' kernels (csrc/cuda/gdn_fused.cu) run on the host: g++ compiles the shipped
source against stand-ins for cuda_bf16.h / cuda_runtime.h (bf16 as its bit pattern with
round-to-nearest-even, each GPU thread a std::thread, CTAs one after another, a warp shuffle an
exchange between two barriers of the warp's threads), with its `kernel<<<grid, block, 0, stream>>>(`
launches rewritten to the stand-in's `emu::launch(kernel, grid, block, `. CPU CI then checks what the
GPU test checks (tests/gdn_fused_checks.py): the launchers' grids, the indexing of strided projection
slices, every output written (NaN-poisoned), and the arithmetic against the torch path on the CPU
under the same bf16 ulp rule. Not checked here: the GPU's own expf / rsqrtf (host libm stands in)."""
import re
import shutil

import pytest
import torch

from conftest import run_on_host
from gdn_fused_checks import check_gated_norm, check_prologue, gdn_block, norm_inputs
from specpilot.settings import CSRC_DIR

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed on this machine")

CUDA_BF16_H = r"""
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
struct __nv_bfloat16 { uint16_t bits; };
inline float __bfloat162float(__nv_bfloat16 x) {
  const uint32_t u = uint32_t(x.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline __nv_bfloat16 __float2bfloat16(float f) {  // round to nearest even, NaN kept quiet
  if (std::isnan(f)) return {0x7FC0};
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return {uint16_t(u >> 16)};
}
"""

CUDA_RUNTIME_H = r"""
#pragma once
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>
#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidValue = 1 };
typedef void* cudaStream_t;
struct dim3 { unsigned x, y, z; dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {} };
struct Idx { unsigned x = 0, y = 0, z = 0; };
inline thread_local Idx threadIdx;
inline Idx blockIdx, gridDim, blockDim;
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
namespace emu {
struct Warp {  // a barrier of the warp's threads, and the slots a shuffle exchanges through
  std::mutex m;
  std::condition_variable cv;
  int size = 32, waiting = 0;
  unsigned phase = 0;
  float slots[32];
  void sync() {
    std::unique_lock<std::mutex> lock(m);
    const unsigned seen = phase;
    if (++waiting == size) { waiting = 0; ++phase; cv.notify_all(); }
    else cv.wait(lock, [&] { return phase != seen; });
  }
};
inline std::vector<Warp>* warps = nullptr;  // the running CTA's
template <class... Params, class... Args>
void launch(void (*kernel)(Params...), dim3 grid, int block, Args... args) {
  gridDim.x = grid.x;
  blockDim.x = block;
  for (unsigned b = 0; b < grid.x; ++b) {
    blockIdx.x = b;
    std::vector<Warp> cta((block + 31) / 32);
    for (size_t w = 0; w < cta.size(); ++w) cta[w].size = std::min(32, block - 32 * int(w));
    warps = &cta;
    std::vector<std::thread> threads;
    for (int t = 0; t < block; ++t) threads.emplace_back([&, t] { threadIdx.x = t; kernel(static_cast<Params>(args)...); });
    for (auto& t : threads) t.join();
  }
}
}  // namespace emu
inline float __shfl_xor_sync(unsigned, float x, int offset) {
  emu::Warp& w = (*emu::warps)[threadIdx.x / 32];
  const int lane = threadIdx.x % 32;
  w.slots[lane] = x;
  w.sync();
  const float y = w.slots[lane ^ offset];
  w.sync();
  return y;
}
"""

MAIN = r"""
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>
#include "cuda_runtime.h"
#include "specpilot/gdn_fused.h"
static std::vector<char> load(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}
template <class T> static void save(const std::string& path, const std::vector<T>& v) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}
int main() {
  using namespace specpilot::gdn;
  int cases = 0;
  for (;; ++cases) {
    const std::string dir = std::string("@ROOT@/case") + std::to_string(cases) + "/";
    std::ifstream meta(dir + "meta.txt");
    if (!meta) break;
    std::string kind;
    meta >> kind;
    int err = 0;
    if (kind == "prologue") {
      long long t, c, hv, width, ld, off_qkv, off_b, off_a;
      int a_log_bf16, dt_bias_bf16;
      meta >> t >> c >> hv >> width >> ld >> off_qkv >> off_b >> off_a >> a_log_bf16 >> dt_bias_bf16;
      const auto proj = load(dir + "proj.bin"), state = load(dir + "conv_state.bin"),
                 weight = load(dir + "conv_weight.bin"), a_log = load(dir + "a_log.bin"),
                 dt_bias = load(dir + "dt_bias.bin");
      const auto* p = reinterpret_cast<const uint16_t*>(proj.data());
      std::vector<uint16_t> window(c * (width - 1 + t), 0x7FC0), mixed(t * c, 0x7FC0);
      std::vector<float> g(t * hv, NAN), beta(t * hv, NAN);
      err = cuda_gdn_prologue(p + off_qkv, ld, p + off_b, ld, p + off_a, ld,
                              reinterpret_cast<const uint16_t*>(state.data()),
                              reinterpret_cast<const uint16_t*>(weight.data()), a_log.data(), a_log_bf16,
                              dt_bias.data(), dt_bias_bf16, (int)c, (int)width, (int)hv, (int)t, window.data(),
                              mixed.data(), g.data(), beta.data(), nullptr);
      save(dir + "window.out", window); save(dir + "mixed.out", mixed); save(dir + "g.out", g);
      save(dir + "beta.out", beta);
    } else {
      long long rows, heads, dv, ldz, off_z;
      int weight_bf16;
      float eps;
      meta >> rows >> heads >> dv >> ldz >> off_z >> weight_bf16 >> eps;
      const auto x = load(dir + "x.bin"), zproj = load(dir + "z.bin"), weight = load(dir + "weight.bin");
      std::vector<uint16_t> out(rows * heads * dv, 0x7FC0);
      err = cuda_gdn_gated_norm(reinterpret_cast<const uint16_t*>(x.data()), heads * dv,
                                reinterpret_cast<const uint16_t*>(zproj.data()) + off_z, ldz, weight.data(),
                                weight_bf16, (int)rows, (int)heads, (int)dv, eps, out.data(), nullptr);
      save(dir + "out.out", out);
    }
    if (err) { std::printf("case %d: launcher refused (%d)\n", cases, err); return 1; }
  }
  std::printf("cases %d\n", cases);
  return 0;
}
"""

PROLOGUE_CASES = [  # t, channels, value heads, conv width, gate parameter dtype
    (1, 8192, 32, 4, torch.bfloat16),            # Qwen3.5-9B's AR step
    (4, 8192, 32, 4, torch.float32),
    (16, 512, 4, 3, torch.bfloat16),
    (64, 320, 2, 2, torch.float32),
]
NORM_CASES = [(1, 32, 128, torch.bfloat16), (4, 32, 128, torch.float32), (6, 4, 64, torch.bfloat16),
              (3, 2, 80, torch.float32)]  # rows, heads, head dim, weight dtype
EPS = 1e-6


def host_source() -> str:
    """gdn_fused.cu with its launches rewritten to the stand-in's emu::launch."""
    src = (CSRC_DIR / "cuda" / "gdn_fused.cu").read_text()
    launch = re.compile(r"(\w+(?:<\w+>)?)<<<([^,]+), ([^,]+), 0, (.+?)>>>\(")
    out, count = launch.subn(r"emu::launch(\1, \2, \3, ", src)
    assert count == 2, f"gdn_fused.cu has {count} launches of the expected form, not 2: update this emulation"
    return out


def raw(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def read(path, dtype, shape) -> torch.Tensor:
    return torch.frombuffer(bytearray(path.read_bytes()), dtype=dtype).reshape(shape)


def write_cases(root, gen):
    """One folder per case: meta.txt and the inputs; returns what each case checks against."""
    cases = []
    for t, c, hv, width, param_dtype in PROLOGUE_CASES:
        folder = root / f"case{len(cases)}"
        folder.mkdir()
        inputs = gdn_block(t, c, hv, width, param_dtype, gen, "cpu")
        qkv, b, a, conv_state, conv_weight, A_log, dt_bias = inputs
        proj = qkv._base                                          # [1, T, ld]: qkv, b, a are its column slices
        assert proj is not None and proj.is_contiguous() and b._base is proj and a._base is proj
        for name, x in (("proj", proj), ("conv_state", conv_state), ("conv_weight", conv_weight),
                        ("a_log", A_log), ("dt_bias", dt_bias)):
            (folder / f"{name}.bin").write_bytes(raw(x))
        is_bf16 = int(param_dtype == torch.bfloat16)
        (folder / "meta.txt").write_text(f"prologue {t} {c} {hv} {width} {proj.stride(1)} {qkv.storage_offset()} "
                                         f"{b.storage_offset()} {a.storage_offset()} {is_bf16} {is_bf16}\n")
        cases.append(("prologue", folder, inputs))
    for rows, heads, dv, weight_dtype in NORM_CASES:
        folder = root / f"case{len(cases)}"
        folder.mkdir()
        x, z, weight = norm_inputs(rows, heads, dv, weight_dtype, gen, "cpu")
        assert z._base is not None and z._base.is_contiguous()
        for name, y in (("x", x), ("z", z._base), ("weight", weight)):
            (folder / f"{name}.bin").write_bytes(raw(y))
        (folder / "meta.txt").write_text(f"norm {rows} {heads} {dv} {z.stride(0)} {z.storage_offset()} "
                                         f"{int(weight_dtype == torch.bfloat16)} {EPS!r}\n")
        cases.append(("norm", folder, (x, z, weight)))
    return cases


def test_fused_kernels_on_the_host(tmp_path, fresh_seed):
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(fresh_seed)
    print(f"seed {fresh_seed}")
    (tmp_path / "cuda_bf16.h").write_text(CUDA_BF16_H)
    (tmp_path / "cuda_runtime.h").write_text(CUDA_RUNTIME_H)
    (tmp_path / "gdn_fused.cpp").write_text(host_source())
    (tmp_path / "main.cpp").write_text(MAIN.replace("@ROOT@", str(tmp_path)))
    cases = write_cases(tmp_path, gen)
    out = run_on_host(tmp_path / "emulation", [tmp_path / "main.cpp", tmp_path / "gdn_fused.cpp"],
                      [tmp_path, CSRC_DIR / "include"], timeout=600)
    assert f"cases {len(cases)}" in out, out
    for kind, folder, inputs in cases:
        if kind == "prologue":
            qkv, b, _, conv_state, conv_weight, _, _ = inputs
            t, c = qkv.shape[1:]
            hv, width = b.shape[-1], conv_weight.shape[1]
            outputs = (read(folder / "window.out", torch.bfloat16, (c, width - 1 + t)),
                       read(folder / "mixed.out", torch.bfloat16, (t, c)),
                       read(folder / "g.out", torch.float32, (t, hv)),
                       read(folder / "beta.out", torch.float32, (t, hv)))
            check_prologue(outputs, inputs)
        else:
            x, z, weight = inputs
            out = read(folder / "out.out", torch.bfloat16, (x.shape[0], x.shape[1] * x.shape[2]))
            check_gated_norm(out, x, z, weight, EPS)
