"""split12 on the H200: CUDA split12_linear == CUDA bf16_linear == the CPU kernels bit for bit,
within the fp64 tolerance, batch-invariant, graph-capturable; odd shapes and Qwen3-8B shapes.
The tensor-core twins (kernel="tc" and the skinny GEMM's kernel="skinny"): split12 == bf16 bit for
bit, M-invariant, within tolerance."""

import pytest
import torch
from conftest import requires_gpu, configured

from specpilot.formats.split12 import ops

pytestmark = [requires_gpu, pytest.mark.gpu, pytest.mark.usefixtures("cuda_build")]

QWEN3_8B = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288),
            "lm_head": (151936, 4096)}


@pytest.fixture
def gen(cuda_gen):
    return cuda_gen


def weights(N, K, g, escape_share=0.002):
    w = (torch.randn(N, K, generator=g, device="cuda") * 0.02).to(torch.bfloat16)
    hit = torch.rand(N, K, generator=g, device="cuda") < escape_share
    vals = torch.tensor([0.0, -0.0, 1e-30, -3e-39, 40.0, -1e4], device="cuda")
    pick = vals[torch.randint(0, 6, (N, K), generator=g, device="cuda")].to(torch.bfloat16)
    return torch.where(hit, pick, w)


def poisoned(M, N):
    return torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")


def same_bits(a, b):
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


def within_tolerance(y, x, w, kernel="simt"):
    """The bounds of ops.py: 2^-8 |ref| + c 2^-24 sum|x w|, c = ceil(K/1024)*32 + 5 (CUDA cores),
    34 ceil(K/128) + 8 (mma.sync) or 2 K (the skinny GEMM)."""
    K = x.shape[1]
    c = {"simt": -(-K // 1024) * 32 + 5, "tc": 34 * -(-K // 128) + 8, "skinny": 2 * K}[kernel]
    exact = x.double() @ w.double().T
    mag = x.double().abs() @ w.double().abs().T
    tol = 2.0 ** -8 * exact.abs() + c * 2.0 ** -24 * mag + 2.0 ** -133
    return bool(((y.double() - exact).abs() <= tol).all())


@pytest.mark.parametrize("M", [1, 2, 7, 16, 32])
@pytest.mark.parametrize("N,K", [(37, 133), (300, 1000), (129, 4100), (64, 1)])
def test_cuda_equals_cpu_and_twin(M, N, K, gen):
    w = weights(N, K, gen, escape_share=0.02)
    x = torch.randn(M, K, generator=gen, device="cuda").to(torch.bfloat16)
    p = ops.pack(w)
    y12 = ops.split12_linear(x, p, out=poisoned(M, N))
    y16 = ops.bf16_linear(x, w, out=poisoned(M, N))
    torch.cuda.synchronize()
    assert not torch.isnan(y12).any()
    assert same_bits(y12, y16)
    cpu = ops.split12_linear(x.cpu(), p.to("cpu"), out=poisoned(M, N).cpu())
    assert same_bits(y12.cpu(), cpu)
    assert within_tolerance(y12, x, w)


@pytest.mark.parametrize("N,K", [(37, 133), (300, 1000), (129, 4104), (64, 1), (5, 8)])
def test_cuda_unpack_equals_the_cpu_decoder_and_dense_equals_torch(N, K, gen):
    """The GPU decoder (the "dense" kernel's first half) gives the packed weight's very bits, tails
    and escapes included; "dense" is then torch's own GEMM on them, for any rows."""
    w = weights(N, K, gen, escape_share=0.02)
    p = ops.pack(w)
    assert same_bits(ops.unpack(p), w)
    assert same_bits(ops.unpack(p).cpu(), ops.unpack(p.to("cpu")))
    x = torch.randn(100, K, generator=gen, device="cuda").to(torch.bfloat16)
    assert same_bits(ops.split12_linear(x, p, out=poisoned(100, N), kernel="dense"),
                     torch.nn.functional.linear(x, w))


@pytest.mark.parametrize("kernel,N,K", [("tc", 37, 133), ("tc", 300, 1000), ("tc", 129, 4100), ("tc", 64, 1),
                                          ("skinny", 37, 136), ("skinny", 300, 1000), ("skinny", 129, 4104),
                                          ("skinny", 64, 8)])
def test_tensor_core_twins_agree_and_are_m_invariant(kernel, N, K, gen):
    """Every row equals the bf16 twin's and the same row computed at any other M, bit for bit
    (kernel="skinny" runs its 20 rows as two launches, 16 + 4)."""
    rows = 32 if kernel == "tc" else 20
    w = weights(N, K, gen, escape_share=0.02)
    p = ops.pack(w)
    x = torch.randn(rows, K, generator=gen, device="cuda").to(torch.bfloat16)
    full = ops.split12_linear(x, p, out=poisoned(rows, N), kernel=kernel)
    assert same_bits(full, ops.bf16_linear(x, w, out=poisoned(rows, N), kernel=kernel))
    assert within_tolerance(full, x, w, kernel=kernel)
    for M in (1, 2, 7, 16):
        y12 = ops.split12_linear(x[:M].contiguous(), p, out=poisoned(M, N), kernel=kernel)
        assert same_bits(y12, full[:M])
        assert same_bits(y12, ops.bf16_linear(x[:M].contiguous(), w, out=poisoned(M, N), kernel=kernel))



def test_decode_bound_grid_keeps_the_twins_identical_on_the_o_projection(gen):
    """With the decode-bound grid on, the Qwen3-8B O projection runs its 64 row blocks cut in two K
    pieces (where the GPU has >= 128 SMs) in both members of the kernel="skinny" pair: still bit for
    bit equal to each other and M-invariant, within tolerance, no poisoned output left."""
    N, K = QWEN3_8B["o"]
    w = weights(N, K, gen)
    p = ops.pack(w)
    x = torch.randn(16, K, generator=gen, device="cuda").to(torch.bfloat16)
    with configured(split12_decode_grid=True):
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        assert ops.skinny_pair_ctas(N, K, x.device) == (128 if sms >= 128 else 0)
        full = ops.split12_linear(x, p, out=poisoned(16, N), kernel="skinny")
        assert same_bits(full, ops.bf16_linear(x, w, out=poisoned(16, N), kernel="skinny"))
        assert within_tolerance(full, x, w, kernel="skinny")
        y3 = ops.split12_linear(x[:3].contiguous(), p, out=poisoned(3, N), kernel="skinny")
        assert same_bits(y3, full[:3])


def test_escape_heavy_rows_and_unaligned_x(gen):
    N, K = 70, 2048
    w = weights(N, K, gen)
    w[3, ::3] = 0.0          # a third of a row escapes
    w[5, :] = 1e-38          # a whole row outside any normal window: its base moves there
    w[6, 1000:1100] = -0.0
    p = ops.pack(w)
    buf = torch.randn(K + 1, generator=gen, device="cuda").to(torch.bfloat16)
    x = buf[1:].view(1, K)   # 2-byte offset: the kernels must take the unaligned path
    assert x.data_ptr() % 16 != 0
    y12 = ops.split12_linear(x, p, out=poisoned(1, N))
    assert same_bits(y12, ops.bf16_linear(x, w, out=poisoned(1, N)))
    assert same_bits(y12.cpu(), ops.split12_linear(x.cpu().contiguous(), p.to("cpu")))
    for kernel in ("tc", "skinny"):
        tc = ops.split12_linear(x, p, out=poisoned(1, N), kernel=kernel)
        assert same_bits(tc, ops.bf16_linear(x, w, out=poisoned(1, N), kernel=kernel))
        assert within_tolerance(tc, x, w, kernel=kernel)


def test_batch_invariant_and_graph_capturable(gen):
    N, K = 512, 4096
    w = weights(N, K, gen)
    p = ops.pack(w)
    x = torch.randn(32, K, generator=gen, device="cuda").to(torch.bfloat16)
    full = ops.split12_linear(x, p)
    for M in (1, 2, 7, 16):
        assert same_bits(ops.split12_linear(x[:M].contiguous(), p), full[:M])
    out = poisoned(16, N)
    xs = x[:16].contiguous()
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        ops.split12_linear(xs, p, out=out)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert same_bits(out, full[:16])


@pytest.mark.parametrize("N,K", [(37, 133), (300, 1000), (129, 4100), (70, 5000), (1000, 4096)])
def test_m1_equals_the_cpu_and_tc_is_m_invariant(N, K, gen):
    """The CUDA-core kernels at M = 1 (streamed or register-fed, by shape) == the CPU and the bf16
    twin; the tensor-core kernel gives each token the same bits at every M, twins agree."""
    w = weights(N, K, gen, escape_share=0.02)
    p = ops.pack(w)
    x = torch.randn(16, K, generator=gen, device="cuda").to(torch.bfloat16)
    y12 = ops.split12_linear(x[:1].contiguous(), p, out=poisoned(1, N))
    assert same_bits(y12.cpu(), ops.split12_linear(x[:1].cpu(), p.to("cpu")))
    assert same_bits(y12, ops.bf16_linear(x[:1].contiguous(), w, out=poisoned(1, N)))
    full = ops.split12_linear(x, p, out=poisoned(16, N), kernel="tc")
    for M in (1, 7, 16):
        xs = x[:M].contiguous()
        tc = ops.split12_linear(xs, p, out=poisoned(M, N), kernel="tc")
        assert same_bits(tc, full[:M]), f"M={M}"
        assert same_bits(tc, ops.bf16_linear(xs, w, out=poisoned(M, N), kernel="tc")), f"M={M}"


def test_pdl_launches_keep_dependent_calls_ordered(gen):
    """The streamed M = 1 GEMV always launches with programmatic dependent launch: in a CUDA graph
    each call reads the previous call's output as x and overwrites a buffer the call before it
    wrote, so a missing wait shows up as a wrong bit (compared with the CPU kernel's chain)."""
    N = K = 4096
    w = weights(N, K, gen)
    p = ops.pack(w)
    x0 = (torch.randn(1, K, generator=gen, device="cuda") * 0.05).to(torch.bfloat16)
    bufs = [poisoned(1, N) for _ in range(3)]

    def chain(x, planes, out):  # x0 -> b0 -> b1 -> b2 -> b0 (the WAW on b0 too)
        ops.split12_linear(x, planes, out=out[0])
        for i in (1, 2, 0):
            ops.split12_linear(out[i - 1], planes, out=out[i])

    want = [torch.empty(1, N, dtype=torch.bfloat16) for _ in range(3)]
    chain(x0.cpu(), p.to("cpu"), want)
    chain(x0, p, bufs)  # eager PDL launches
    assert all(same_bits(b.cpu(), e) for b, e in zip(bufs, want))
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        chain(x0, p, bufs)
    for b in bufs:
        b.fill_(float("nan"))
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    assert all(same_bits(b.cpu(), e) for b, e in zip(bufs, want))


@pytest.mark.parametrize("name", list(QWEN3_8B))
def test_qwen3_8b_shapes(name, gen):
    N, K = QWEN3_8B[name]
    w = weights(N, K, gen, escape_share=1e-4)
    p = ops.pack(w)
    rows = torch.randperm(N, device="cuda")[:64].sort().values
    p_rows = ops.pack(w[rows].contiguous()).to("cpu")  # rows pack independently: same planes as in p
    for M in (1, 16):
        x = torch.randn(M, K, generator=gen, device="cuda").to(torch.bfloat16)
        y12 = ops.split12_linear(x, p, out=poisoned(M, N))
        y16 = ops.bf16_linear(x, w, out=poisoned(M, N))
        assert same_bits(y12, y16)
        assert within_tolerance(y12, x, w)
        assert same_bits(y12[:, rows].cpu(), ops.split12_linear(x.cpu(), p_rows))
        for kernel in ("tc", "skinny"):
            tc = ops.split12_linear(x, p, out=poisoned(M, N), kernel=kernel)
            assert same_bits(tc, ops.bf16_linear(x, w, out=poisoned(M, N), kernel=kernel))
            assert within_tolerance(tc, x, w, kernel=kernel)
