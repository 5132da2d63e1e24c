"""split12 / bf16 linear ops and the C++ packer, choosing CUDA or CPU by the tensors' device.

Exactness contracts:
- `pack` / `unpack`: bit-exact (C++ packer, planes byte-identical to reference.pack).
- `split12_linear(x, p)` and `bf16_linear(x, unpack(p))`: bit-identical to each other, on CPU and
  CUDA and for every M (fixed reduction order, split12_format.h); against the fp64 reference within
  fp32 accumulation error: |y - ref| <= 2^-8 |ref| + (ceil(K/1024)*32 + 5) 2^-24 sum_k |x_k w_k|
  (a lane chains <= ceil(K/1024)*32 fmaf, the tree adds 5; then one bf16 rounding).
- kernel="tc" (CUDA only, tensor cores, mma.sync): split12 == bf16 twin bit for bit and each
  token's output is independent of M, but the order is the mma's, not the CPU's: against the
  fp64 reference |y - ref| <= 2^-8 |ref| + (34 ceil(K/128) + 8) 2^-24 sum_k |x_k w_k| (a warp
  chains ceil(K/128) mma, each adding 16 products with at most 17 truncations of <= 2^-23; then
  8 fp32 adds over warps).
- kernel="skinny" (CUDA only, 1..16 rows per launch; TMA + wgmma, csrc/cuda/split12_skinny.cu and
  skinny_gemm.cu): split12 == bf16 twin bit for bit (the split12 kernel decodes into the very tiles
  the bf16 kernel loads and runs the same wgmmas and K-ordered sums), each token's output is
  independent of M; the order is the skinny GEMM's: |y - ref| <= 2^-8 |ref| + 2K 2^-24 sum_k |x_k w_k|
  (wgmma chains over K; the bound the skinny GEMM's own tests use).
- kernel="dense" (many rows: prefill): decode the weight to a bf16 scratch matrix (`unpack`, on the
  planes' device) and run torch's F.linear (cuBLAS on CUDA). Compute-bound there, so the decode pass
  is cheap, and the result is the bf16 model's nn.Linear bit for bit (same GEMM, same weight bits).
"""
import functools

import torch

from specpilot import _ext, config
from specpilot.kernels import registry, skinny_workspace
from specpilot.kernels.dispatch import integrated_launcher

from .reference import Split12Tensor

CUDA_MAX_M = 32  # rows per CUDA launch; larger M is split into chunks (rows are independent)
KERNELS = ("simt", "tc", "skinny", "dense")  # CUDA-core lane-tree order (CPU-identical) / mma.sync / TMA + wgmma /
#                                             decode + torch's GEMM


# The grid of the kernel="skinny" pair. The split12 skinny GEMM is limited by its decoder warps, about
# one stage per 1.6-1.8 us per SM whatever the grid, not by HBM, so an SM without a CTA is decode
# throughput lost. The bf16 planner (skinny_plan_ctas) gives a whole row block per CTA where it can,
# which on the Qwen3-8B O projection (64 row blocks) leaves half the SMs idle. The decode-bound grid
# cuts each row block into the most equal K pieces that still give one CTA per SM, where the
# planner's grid covers fewer than half the SMs (O: 64 -> 128 CTAs; H200: 1.26 -> 1.12x the bf16
# kernel's time). Both members of the pair take the same grid, so they stay bit-identical; the cut
# changes the fp32 order against the planner's grid (K pieces summed in K order). H100: O at 16 rows
# 15.2 -> 13.7 us, the split12 verify step 5.27 -> 5.16 ms (docs/design.md).
# EngineConfig.split12_decode_grid turns it off.
STEP_K = 256       # weight columns per skinny step (kStepK, csrc/cuda/skinny_common.cuh)
ROWS_PER_BLOCK = 64  # weight rows per row block (kRowsPerCta, csrc/include/specpilot/skinny_gemm.h)
def decode_bound_ctas(n: int, k: int, sms: int, planned: int) -> int:
    """The decode-bound grid for an N x K weight on `sms` SMs where the planner gives `planned` CTAs;
    0 where it keeps the planner's."""
    blocks, k_steps = -(-n // ROWS_PER_BLOCK), -(-k // STEP_K)
    if 2 * planned >= sms:
        return 0
    cuts = [j for j in range(2, k_steps + 1) if k_steps % j == 0 and blocks * j <= sms]
    return blocks * max(cuts) if cuts and blocks * max(cuts) > planned else 0


@functools.lru_cache(maxsize=None)
def _pair_ctas(n: int, k: int, device_index: int) -> int:
    sms = torch.cuda.get_device_properties(device_index).multi_processor_count
    return decode_bound_ctas(n, k, sms, _ext.ops().skinny_plan_ctas(n, k))


def skinny_pair_ctas(n: int, k: int, device: torch.device) -> int:
    """The grid both kernel="skinny" launches of an N x K weight use: 0 (the planner's) unless the
    decode-bound grid (EngineConfig.split12_decode_grid) is on and differs."""
    return _pair_ctas(n, k, device.index or 0) if config.current().split12_decode_grid else 0


def _cuda_live() -> bool:
    return _ext.has_cuda_kernels() and torch.cuda.is_available()


def _cpu_live() -> bool:
    _ext.load()
    return True


for _op in ("split12_linear", "bf16_linear"):
    registry.register(_op, "cuda-sm90a", _cuda_live)
    registry.register(_op, "cpu-ref", _cpu_live)
    registry.register(_op + "_tc", "cuda-sm90a-mma", _cuda_live)
    registry.register(_op + "_skinny", "cuda-sm90a-wgmma", lambda: _cuda_live() and _ext.has_cuda_op("skinny_gemm"))


def _check_kernel(name: str, kernel: str, x: torch.Tensor) -> None:
    if kernel not in KERNELS:
        raise ValueError(f"{name}: kernel must be one of {KERNELS}, got {kernel!r}")
    if kernel in ("tc", "skinny") and x.device.type != "cuda":
        raise ValueError(f"{name}: kernel={kernel!r} runs on CUDA only, x is on {x.device}")


def _op(name: str, kernel: str, x: torch.Tensor):
    """The simt or tc op (the skinny kernels launch through kernels/skinny_workspace.run)."""
    return getattr(_ext.ops(), name + "_tc" if kernel == "tc" else name)


def pack(w: torch.Tensor) -> Split12Tensor:
    """bf16 [N, K] -> Split12Tensor on w's device (packed by the C++ packer on the CPU)."""
    if w.dim() != 2 or w.dtype != torch.bfloat16:
        raise ValueError(f"split12 pack: expected a 2-D bfloat16 matrix, got {w.dtype} {list(w.shape)}")
    planes = _ext.ops().split12_pack(w.detach().cpu().contiguous())
    p = Split12Tensor(*planes, N=w.shape[0], K=w.shape[1])
    return p.to(w.device) if w.device.type != "cpu" else p


def unpack(p: Split12Tensor) -> torch.Tensor:
    """Split12Tensor -> bf16 [N, K] on the planes' device. Bit-exact (decoded on the GPU for CUDA
    planes when the build has the CUDA kernels, else on the CPU)."""
    if p.lo.device.type == "cuda" and _cuda_live():
        return _ext.ops().split12_unpack(*p.planes().values(), p.K)
    cpu = p.to("cpu") if p.lo.device.type != "cpu" else p
    w = _ext.ops().split12_unpack(*cpu.planes().values(), p.K)
    return w.to(p.lo.device)


def _dense(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """kernel="dense": torch's own GEMM (what nn.Linear runs), copied into out if one is given."""
    y = torch.nn.functional.linear(x, w)
    return y if out is None else _out(x, w.shape[0], out).copy_(y)


def _out(x: torch.Tensor, N: int, out):
    M = x.shape[0]
    if out is None:
        return torch.empty(M, N, dtype=torch.bfloat16, device=x.device)
    if out.shape != (M, N) or out.dtype != torch.bfloat16 or out.device != x.device:
        raise ValueError(f"out must be bfloat16 [{M}, {N}] on {x.device}, got {out.dtype} {list(out.shape)} "
                         f"on {out.device}")
    return out


def _chunks(x: torch.Tensor, out: torch.Tensor):
    """(x rows, out rows) pieces the kernels accept (CUDA takes M <= 32)."""
    if x.device.type != "cuda" or x.shape[0] <= CUDA_MAX_M:
        return [(x, out)]
    return [(x[i:i + CUDA_MAX_M], out[i:i + CUDA_MAX_M]) for i in range(0, x.shape[0], CUDA_MAX_M)]


def split12_linear(x: torch.Tensor, p: Split12Tensor, out: torch.Tensor | None = None,
                   kernel: str = "simt") -> torch.Tensor:
    """y = x @ W.T: x bf16 [M, K] contiguous, W = p [N, K] -> y bf16 [M, N] (written into out if given)."""
    if x.dim() != 2 or x.shape[1] != p.K:
        raise ValueError(f"split12_linear: x must be [M, K={p.K}], got {list(x.shape)}")
    _check_kernel("split12_linear", kernel, x)
    if kernel == "dense":
        return _dense(x, unpack(p), out)
    out = _out(x, p.N, out)
    planes = list(p.planes().values())
    if kernel == "skinny":
        ctas = skinny_pair_ctas(p.N, p.K, x.device)
        return skinny_workspace.run(x, out, p.N, p.K, lambda xs, ys, partials, counters: _ext.ops().split12_skinny_gemm(
            xs, *planes, p.K, ctas, True, ys, partials, counters), ctas)
    op = _op("split12_linear", kernel, x)
    if kernel == "simt" and x.is_cuda and x.shape[0] == 1 and x.is_contiguous() and out.is_contiguous():
        launch = integrated_launcher("split12_gemv", (p.N, p.K), x.device)  # agent-integrated variant
        if launch is not None:
            launch(x, *planes, out)
            return out
    for xs, ys in _chunks(x, out):
        op(xs, *planes, p.K, ys)
    return out


def bf16_linear(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None,
                kernel: str = "simt") -> torch.Tensor:
    """y = x @ w.T in split12's reduction order: x bf16 [M, K], w bf16 [N, K] -> y bf16 [M, N]."""
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"bf16_linear: need x [M, K] and w [N, K], got {list(x.shape)} and {list(w.shape)}")
    _check_kernel("bf16_linear", kernel, x)
    if kernel == "dense":
        return _dense(x, w, out)
    out = _out(x, w.shape[0], out)
    if kernel == "skinny":
        ctas = skinny_pair_ctas(w.shape[0], w.shape[1], x.device)
        return skinny_workspace.run(x, out, w.shape[0], w.shape[1], lambda xs, ys, partials, counters: _ext.ops().skinny_gemm(
            w, xs, ctas, True, ys, partials, counters), ctas)
    op = _op("bf16_linear", kernel, x)
    for xs, ys in _chunks(x, out):
        op(xs, w, ys)
    return out
