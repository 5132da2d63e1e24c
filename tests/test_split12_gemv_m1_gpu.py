"""split12_gemv_m1 and its bf16 twin (the one-token split12 GEMV with gemv_m1's fused prologues) on
the H200: for each prologue, bit for bit the separate op (add_rms_norm / silu_mul) followed by
split12_linear on CUDA and on the CPU, split12 == twin, escape-heavy rows included, outputs
poisoned with NaN first; bad K refused; and a split12 engine's graphed one-token step with the
fusion on equals it with the fusion off, bit for bit. Skipped on CPU."""

import pytest
import torch

from conftest import refused_in_subprocess, requires_gpu, configured
from test_engine_helpers import fresh_seed
from test_split12_gpu import poisoned, same_bits, weights, within_tolerance

pytestmark = [requires_gpu, pytest.mark.gpu, pytest.mark.usefixtures("cuda_build")]

EPS = 1e-6
PLAIN, ADD_NORM, SILU_MUL = 0, 1, 2
# Odd N, K from one chunk (32) to the largest the kernel takes; Qwen3-8B's qkv and down.
SHAPES = [(1, 32), (37, 512), (1001, 4096), (6144, 4096), (4096, 12288), (3, 16384)]


@pytest.fixture(scope="module")
def ops():
    from specpilot.models import gemv_fusion

    assert gemv_fusion.available(), "the extension was built without gemv_m1"
    return torch.ops.specpilot


def prologue_case(ops, prologue, k, g):
    """(x, delta, norm_w, the GEMV's input computed by the separate op, the sum add_rms_norm wrote)."""
    bf = lambda *s, scale=1.0: (torch.randn(*s, generator=g, device="cuda") * scale).to(torch.bfloat16)
    if prologue == PLAIN:
        x = bf(k)
        return x, None, None, x, None
    if prologue == SILU_MUL:
        x = bf(2 * k, scale=3.0)
        gated = torch.empty(k, device="cuda", dtype=torch.bfloat16)
        ops.silu_mul(x, gated)
        return x, None, None, gated, None
    x, delta = bf(k), bf(k)
    norm_w = (1 + 0.1 * torch.randn(k, generator=g, device="cuda")).to(torch.bfloat16)
    total, normed = torch.empty_like(x), torch.empty_like(x)
    ops.add_rms_norm(x, delta, norm_w, EPS, total, normed)
    return x, delta, norm_w, normed, total


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("prologue", [PLAIN, ADD_NORM, SILU_MUL])
def test_fused_split12_gemv_is_the_separate_ops_bit_for_bit(ops, cuda_gen, n, k, prologue):
    from specpilot.formats.split12 import ops as s12

    if prologue == ADD_NORM and k > 4096:
        pytest.skip("the add + RMSNorm prologue takes K <= 4096")
    w = weights(n, k, cuda_gen, escape_share=0.01)
    p = s12.pack(w)
    x, delta, norm_w, inp, total = prologue_case(ops, prologue, k, cuda_gen)
    want = s12.split12_linear(inp[None], p, out=poisoned(1, n))[0]
    want_cpu = s12.split12_linear(inp[None].cpu(), p.to("cpu"), out=poisoned(1, n).cpu())[0]
    y, y_twin = poisoned(1, n)[0], poisoned(1, n)[0]
    sum_out = torch.full_like(x[:k], float("nan")) if delta is not None else None
    ops.split12_gemv_m1(*p.planes().values(), k, x, delta, norm_w, EPS, prologue, True, y, sum_out)
    ops.bf16_gemv_m1_twin(w, x, delta, norm_w, EPS, prologue, True, y_twin, None)
    torch.cuda.synchronize()
    assert not y.isnan().any(), "split12_gemv_m1 left poisoned (NaN) outputs"
    assert same_bits(y, want), "fused split12 GEMV != separate op + split12_linear (CUDA)"
    assert same_bits(y.cpu(), want_cpu), "fused split12 GEMV != separate op + split12_linear (CPU)"
    assert same_bits(y, y_twin), "split12 != its bf16 twin"
    if delta is not None:
        assert same_bits(sum_out, total), "sum_out != add_rms_norm's sum"
    assert within_tolerance(y[None], inp[None], w)


def test_pdl_chain_in_a_cuda_graph_equals_the_plain_launches(ops, cuda_gen):
    """Four split12 GEMVs chained through their prologues (a layer's one-token step), captured with
    PDL and replayed twice, equal the chain launched without PDL, bit for bit."""
    from specpilot.formats.split12.linear import Split12Linear
    from specpilot.models import gemv_fusion

    h, inter = 1024, 3072
    lin = {name: Split12Linear.from_weight(weights(n, k, cuda_gen)).cuda()
           for name, (n, k) in {"qkv": (1536, h), "o": (h, h), "gate_up": (2 * inter, h), "down": (h, inter)}.items()}
    norm_w = (1 + 0.1 * torch.randn(h, generator=cuda_gen, device="cuda")).to(torch.bfloat16)
    x = torch.randn(1, h, generator=cuda_gen, device="cuda").to(torch.bfloat16)
    delta = torch.randn(1, h, generator=cuda_gen, device="cuda").to(torch.bfloat16)

    def chain():
        s, q = gemv_fusion.norm_linear(x, delta, norm_w, EPS, lin["qkv"])
        o = gemv_fusion.linear(q[..., :h], lin["o"])
        s2, gu = gemv_fusion.norm_linear(s, o, norm_w, EPS, lin["gate_up"])
        return s2, gemv_fusion.silu_mul_linear(gu, lin["down"])

    with configured(gemv_pdl=False):
        want = chain()
    with configured(gemv_pdl=True):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            got = chain()
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        assert all(same_bits(a, b) for a, b in zip(got, want))


def test_bad_inputs_are_refused_with_the_reason(ops):
    setup = """
    from specpilot.formats.split12 import ops as s12
    w = bf(16, 64)
    planes = list(s12.pack(w).planes().values())  # on w's device
    g12, twin = ops.split12_gemv_m1, ops.bf16_gemv_m1_twin
    """
    refused_in_subprocess(setup, [
        ("twin(bf(16, 40), bf(40), None, None, 0.0, 0, True, bf(16), None)", "multiple of 32"),
        ("g12(*planes, 40, bf(40), None, None, 0.0, 0, True, bf(16), None)", "multiple of 32"),
        ("g12(*planes, 64, bf(64), None, None, 0.0, 0, True, bf(15), None)", "must hold 16 values"),
        ("g12(*planes, 64, bf(64), None, None, 0.0, 1, True, bf(16), None)", "needs norm_weight"),
        ("g12(*planes[:4], planes[4].long(), planes[5], 64, bf(64), None, None, 0.0, 0, True, bf(16), None)",
         "esc_col must be Int"),
    ])


@pytest.mark.parametrize("family", ["tiny-qwen3", "tiny-llama"])
def test_split12_engine_one_token_step_fused_equals_unfused(family, monkeypatch):
    """weights="split12" and its bf16 twin: the graphed one-token step gives the same logits bit for
    bit with the fused split12 GEMVs on (opt-in) and off, and split12 == twin in both."""
    import tempfile

    from specpilot.engine import Engine
    from specpilot.formats.split12.linear import Split12Linear, swap_linears
    from specpilot.models import gemv_fusion, load_drafter, load_target
    from specpilot.models.random_ckpt import write_pair

    seed = fresh_seed()
    print(f"seed {seed}")
    with tempfile.TemporaryDirectory() as tmp:
        t, d = write_pair(tmp, family, layer_ids=[0, 2], block_size=8, seed=seed)
        s12 = load_target(t, device="cuda", dtype=torch.bfloat16, weights="split12")
        twin = load_target(t, device="cuda", dtype=torch.bfloat16)
        swap_linears(twin, kind="bf16")
        drafters = [load_drafter(d, m) for m in (s12, twin)]
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, 300, (1, 40), generator=g).cuda()
    ids = torch.randint(0, 300, (1, 1), generator=g).cuda()
    launched = []  # the kinds of linear the fused GEMVs ran on
    real_launch = gemv_fusion._launch
    monkeypatch.setattr(gemv_fusion, "_launch", lambda proj, *a: launched.append(type(proj)) or real_launch(proj, *a))
    logits = {}
    for on in (True, False):
        with configured(fused_gemv=on), configured(gemv_fusion.set_fused_split12_gemv, True), \
                torch.inference_mode():
            for name, model, drafter in (("split12", s12, drafters[0]), ("twin", twin, drafters[1])):
                eng = Engine(model, drafter, max_seq_len=300)
                eng.runner.prefill(prompt, with_features=True)
                logits[name, on] = eng.runner.target_step(ids, 40, with_features=False)[0].clone()
        assert (Split12Linear in launched) == on, f"fused split12 GEMVs ran: {Split12Linear in launched}, on: {on}"
        launched.clear()
    assert not logits["split12", True].isnan().any()
    assert same_bits(logits["split12", True], logits["split12", False]), "fused one-token step != unfused"
    assert same_bits(logits["split12", True], logits["twin", True]), "split12 != bf16 twin (fused)"
    assert same_bits(logits["twin", True], logits["twin", False])
