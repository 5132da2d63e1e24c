"""specpilot::paged_decode_attention on the GPU (csrc/cuda/decode_attention.cu, PagedKV) against the fp64
torch reference (kernels/paged_attention.py): R = 1 / 8 / 32 requests, T = 1 and 16, ragged contexts
1..2000 on pages shuffled across the pool, padding rows and padding requests, GQA g = 4, D 64 and 128,
page sizes 1..256, every split path; bit-identical to the single-request kernel on each request's
gathered cache; pages outside the pool read as zeros; a CUDA graph replayed with grown `last` and a
changed page table, PDL on and off; bad arguments refused.

Tolerance (kernel vs fp64), as tests/test_decode_attention_gpu.py: |out - ref| <= 2^-8 (|ref| +
sum_j p_j |v_j|) + 1e-6 (bf16 output rounding, P rounded to bf16 before P.V, twice over). Every slot
no request owns holds NaN, so a read outside a request's pages shows. Skipped on CPU."""
import pytest
import torch
from conftest import configured, refused_in_subprocess, requires_gpu

from paged_attention_helpers import paged_case, slots_of
from specpilot import _ext
from specpilot.kernels import paged_attention as pa

pytestmark = [requires_gpu, pytest.mark.gpu, pytest.mark.usefixtures("cuda_build")]


@pytest.fixture
def gen(fresh_seed):
    print(f"seed {fresh_seed}")
    return torch.Generator().manual_seed(fresh_seed)


def bf16_case(gen, contexts, rows, hq, hkv, t, d, page_size, spare_pages=3):
    return paged_case(gen, contexts, rows, hq, hkv, t, d, page_size, torch.bfloat16, "cuda", spare_pages)


def assert_close_to_reference(out, q, k, v, table, page_size, last, scale):
    dbl = lambda x: x.double()
    ref = pa.reference(dbl(q), dbl(k), dbl(v), table, page_size, last, scale)
    mag = pa.reference(dbl(q), dbl(k), dbl(v).abs(), table, page_size, last, scale)    # sum_j p_j |v_j|
    assert not torch.isnan(out).any(), "NaN in the output (a slot outside the request's pages was read)"
    err = (out.double() - ref).abs()
    worst = (err - (2.0 ** -8 * (ref.abs() + mag) + 1e-6)).max()
    assert worst <= 0, f"max excess over tolerance {float(worst):.3g}, max err {float(err.max()):.3g}"
    pad = last < 0
    pad_rows = out[pad.all(dim=1)]
    assert torch.equal(pad_rows, torch.zeros_like(pad_rows)), "a padding request's rows must be zeros"


def run_kernel(q, k, v, table, page_size, last, scale, splits=None):
    """The op with out / workspace poisoned with NaN, with and without writes_at_last (no writer
    before it: loading keys early changes no bit)."""
    if splits is None:
        splits = pa.default_splits(q.shape, k.shape[1], table.shape[1] * page_size, q.device)
    outs = []
    for writes_at_last in (False, True):
        out = torch.full((q.shape[0], q.shape[2], q.shape[1] * q.shape[3]), float("nan"), dtype=q.dtype,
                         device="cuda")
        ws = pa.new_workspace(splits, q.shape, "cuda").fill_(float("nan"))
        pa.paged_decode_attention(q, k, v, table, page_size, last, scale, out, ws, writes_at_last)
        outs.append(out)
    assert torch.equal(outs[0], outs[1]), "writes_at_last changed the output"
    return outs[0]


def ragged(gen, r, t, max_context=2000):
    """Contexts in 1..max_context (the first request 1, the second max_context) and rows in 1..T per
    request (the rest padding)."""
    contexts = torch.randint(1, max_context + 1, (r,), generator=gen).tolist()
    rows = torch.randint(1, t + 1, (r,), generator=gen).tolist()
    contexts[0] = 1
    if r > 1:
        contexts[1] = max_context
    return contexts, [min(m, n) for m, n in zip(rows, contexts)]


@pytest.mark.parametrize("r", [1, 8, 32])
@pytest.mark.parametrize("t", [1, 16])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("splits", [None, 1, 5])
def test_ragged_requests_match_fp64(gen, r, t, d, splits):
    """Qwen3-8B's heads (32 / 8, g = 4) at D 128, the zoo's (8 / 2) at D 64; page size 16."""
    hq, hkv = (32, 8) if d == 128 else (8, 2)
    contexts, rows = ragged(gen, r, t)
    q, k, v, table, last = bf16_case(gen, contexts, rows, hq, hkv, t, d, 16)
    out = run_kernel(q, k, v, table, 16, last, d ** -0.5, splits)
    assert_close_to_reference(out, q, k, v, table, 16, last, d ** -0.5)


@pytest.mark.parametrize("page_size", [1, 8, 64, 128, 256])
def test_page_sizes(gen, page_size):
    """Pages smaller than, equal to and larger than the 64-key tile (a tile spans several pages, or a
    page several tiles)."""
    t, d = 16, 128
    contexts, rows = ragged(gen, 6, t, max_context=700)
    q, k, v, table, last = bf16_case(gen, contexts, rows, 32, 8, t, d, page_size)
    for splits in (None, 1, 3):
        out = run_kernel(q, k, v, table, page_size, last, d ** -0.5, splits)
        assert_close_to_reference(out, q, k, v, table, page_size, last, d ** -0.5)


def test_padding_and_noncausal_rows(gen):
    """A request of padding rows only, a batch of padding only (zeros), the drafter's non-causal
    block rows, ragged rows with gaps, a row past the span."""
    t, d, ps = 16, 128, 16
    q, k, v, table, last = bf16_case(gen, [300, 48, 1008, 5], [16, 16, 16, 0], 32, 8, t, d, ps)
    assert table.shape[1] * ps == 1008                                # the span: request 2 owns all of it
    last[0] = 299                                                     # every row sees the whole block
    last[1] = torch.randint(-3, 48, (t,), generator=gen).cuda()
    last[2, 3] = 10 ** 6                                              # clamped to the span
    for splits in (None, 1, 7):
        out = run_kernel(q, k, v, table, ps, last, d ** -0.5, splits)
        assert_close_to_reference(out, q, k, v, table, ps, last, d ** -0.5)
        all_pad = torch.full_like(last, -1)
        zeros = run_kernel(q, k, v, table, ps, all_pad, d ** -0.5, splits)
        assert torch.equal(zeros, torch.zeros_like(zeros))


@pytest.mark.parametrize("t", [1, 16])
@pytest.mark.parametrize("d", [64, 128])
def test_bit_identical_to_single_request_kernel(gen, t, d):
    """Each request's rows equal decode_attention over its keys gathered into a static cache of the
    same span, with the same splits, bit for bit: the paged path changes where keys come from, not
    the arithmetic."""
    hq, hkv = (32, 8) if d == 128 else (8, 2)
    ps = 16
    contexts, rows = ragged(gen, 8, t, max_context=1500)
    q, k, v, table, last = bf16_case(gen, contexts, rows, hq, hkv, t, d, ps)
    span = table.shape[1] * ps
    for splits in (1, 4):
        out = run_kernel(q, k, v, table, ps, last, d ** -0.5, splits)
        for r, n in enumerate(contexts):
            kc = torch.full((1, hkv, span, d), float("nan"), dtype=k.dtype, device="cuda")
            vc = kc.clone()
            kc[:, :, :n] = k[:, :, slots_of(table[r], n, ps)]
            vc[:, :, :n] = v[:, :, slots_of(table[r], n, ps)]
            single = torch.empty(1, t, hq * d, dtype=q.dtype, device="cuda")
            ws = torch.empty(splits, t * hq, d + 1, dtype=torch.float32, device="cuda")
            _ext.ops().decode_attention(q[r:r + 1].contiguous(), kc, vc, last[r].contiguous(), span, d ** -0.5,
                                        single, ws, False)
            assert torch.equal(out[r], single[0]), f"request {r} (context {n}, splits {splits})"


def test_pages_outside_the_pool_read_as_zeros(gen):
    """A visible key on a page index outside the pool (or negative) is never read out of bounds: it
    reads as zeros, the same bits as a zero-filled page in the pool."""
    t, d, ps = 4, 128, 16
    q, k, v, table, last = bf16_case(gen, [100, 40], [4, 4], 32, 8, t, d, ps, spare_pages=1)
    zero_page = (set(range(k.shape[2] // ps)) - set(table[table >= 0].tolist())).pop()   # no request owns it
    k[:, :, zero_page * ps:] = 0
    v[:, :, zero_page * ps:] = 0
    for bad in (10 ** 6, -5):
        outside, inside = table.clone(), table.clone()
        outside[0, 2], inside[0, 2] = bad, zero_page
        for splits in (1, 3):
            got = run_kernel(q, k, v, outside, ps, last, d ** -0.5, splits)
            want = run_kernel(q, k, v, inside, ps, last, d ** -0.5, splits)
            assert torch.equal(got, want)
    with pytest.raises(ValueError, match="outside the pool"):
        pa.check_page_table(outside, ps, last, k.shape[2])


@pytest.mark.parametrize("pdl", [False, True])
def test_graph_replay_follows_last_and_table(gen, pdl):
    """One captured call (fixed page-table width, so a fixed grid) replayed as the contexts grow by
    a verify block a step, and with two requests' page-table rows swapped: every replay matches the
    reference."""
    t, d, ps, r = 16, 128, 16, 8
    with configured(attention_pdl=pdl):
        full = torch.randint(400, 2001, (r,), generator=gen).tolist()
        q, k, v, table, _ = bf16_case(gen, full, [t] * r, 32, 8, t, d, ps)
        contexts = [n - 300 for n in full]
        causal = lambda ctx: torch.stack([torch.arange(n - t, n) for n in ctx]).cuda()
        last = causal(contexts)
        splits = pa.default_splits(q.shape, 8, table.shape[1] * ps, q.device)
        out = torch.empty(r, t, 32 * d, dtype=torch.bfloat16, device="cuda")
        ws = pa.new_workspace(splits, q.shape, "cuda")
        pa.paged_decode_attention(q, k, v, table, ps, last, d ** -0.5, out, ws)    # warm-up outside capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            pa.paged_decode_attention(q, k, v, table, ps, last, d ** -0.5, out, ws)
        for step in range(5):
            contexts = [min(n + 60 * step, m) for n, m in zip(contexts, full)]
            last.copy_(causal(contexts))
            if step == 3:                      # requests 0 and 1 trade pages (and so keys)
                table.copy_(table[torch.tensor([1, 0] + list(range(2, r)))])
                contexts[0], contexts[1] = contexts[1], contexts[0]
                full[0], full[1] = full[1], full[0]
                last.copy_(causal(contexts))
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            assert_close_to_reference(out, q, k, v, table, ps, last, d ** -0.5)


def test_rejects_bad_arguments():
    setup = """
    q, k = bf(2, 8, 1, 128), bf(1, 2, 256, 128)
    table = torch.zeros(2, 4, dtype=torch.int32, device="cuda")
    last = torch.zeros(2, 1, dtype=torch.long, device="cuda")
    out = torch.empty(2, 1, 1024, dtype=torch.bfloat16, device="cuda")
    ws = torch.empty(4, 16, 129, dtype=torch.float32, device="cuda")
    op = ops.paged_decode_attention
    """
    refused_in_subprocess(setup, [
        ("op(q[..., :96], k[..., :96], k[..., :96], table, 16, last, 0.1, out, ws)", "head dim"),
        ("op(q, k, k, table, 12, last, 0.1, out, ws)", "page_size must be a power of two"),
        ("op(q, k, k, table.long(), 16, last, 0.1, out, ws)", "page_table must be an int32"),
        ("op(q, k, k, table[:1], 16, last, 0.1, out, ws)", "page_table must be"),
        ("op(q, k, k, table, 16, last[:, :0], 0.1, out, ws)", "last must be"),
        ("op(q, bf(2, 2, 256, 128), bf(2, 2, 256, 128), table, 16, last, 0.1, out, ws)", "k_pool must be"),
        ("op(q, k, k[:, :, :128], table, 16, last, 0.1, out, ws)", "v_pool shape"),
        ("op(q, k[:, :, :200], k[:, :, :200], table, 16, last, 0.1, out, ws)", "multiple of page_size"),
        ("op(q, k, k, table, 16, last, 0.1, out, ws[:, :8])", "workspace"),
        ("op(q, k, k, table, 16, last, float('inf'), out, ws)", "scale"),
    ])
