"""kernels/paged_attention.py on the CPU: the torch reference against a plain per-request gathered SDPA
(fp32 and fp64; pages shuffled across the pool, ragged contexts and `last`, padding rows, GQA, D 64
and 128, non-causal rows, `last` past the span), the dispatch writing into `out`, and the argument
and page-table checks. The CUDA kernel against this reference: tests/test_paged_attention_gpu.py."""
import pytest
import torch

from paged_attention_helpers import gathered_sdpa, paged_case
from specpilot.kernels import paged_attention as pa

TOL = {torch.float64: dict(rtol=1e-10, atol=1e-10), torch.float32: dict(rtol=1e-5, atol=1e-5)}


@pytest.fixture
def gen(fresh_seed):
    return torch.Generator().manual_seed(fresh_seed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("hq,hkv", [(8, 2), (4, 4)])
@pytest.mark.parametrize("t", [1, 5])
@pytest.mark.parametrize("page_size", [16, 4])
def test_reference_equals_gathered_sdpa(gen, dtype, d, hq, hkv, t, page_size):
    contexts = [37, 1, 70, 16, 9]
    rows = [t, 1, max(1, t - 2), 0, t]                      # request 3 is all padding
    q, k, v, table, last = paged_case(gen, contexts, rows, hq, hkv, t, d, page_size, dtype)
    got = pa.reference(q, k, v, table, page_size, last, d ** -0.5)
    want = gathered_sdpa(q, k, v, table, page_size, last, d ** -0.5)
    assert got.dtype == dtype and got.shape == (5, t, hq * d)
    assert not torch.isnan(got).any(), "a slot no request owns was read"
    torch.testing.assert_close(got, want, **TOL[dtype])
    pad = last < 0
    assert pad.any() and torch.equal(got[pad], torch.zeros_like(got[pad])), "padding rows must be zeros"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ragged_and_noncausal_last(gen, dtype):
    """Rows with arbitrary `last`: the drafter's block rows all seeing the block's last key, rows with
    gaps, negative rows, and a row past the span (P * page_size: it sees every key it can address)."""
    d, hq, hkv, t, ps = 64, 8, 2, 6, 8
    q, k, v, table, _ = paged_case(gen, [40, 24, 17], [t] * 3, hq, hkv, t, d, ps, dtype)
    assert table.shape[1] * ps == 40                            # the span; request 0 owns all of it
    last = torch.tensor([[39, 39, 100, 39, 39, 39],
                         [-1, 0, 23, 5, -7, 12],
                         [16, 3, 16, 16, -1, 0]])
    got = pa.reference(q, k, v, table, ps, last, 0.3)
    torch.testing.assert_close(got, gathered_sdpa(q, k, v, table, ps, last, 0.3), **TOL[dtype])
    assert not torch.isnan(got).any()
    at_end = last.clone()
    at_end[0, 2] = 39
    assert torch.equal(pa.reference(q, k, v, table, ps, at_end, 0.3), got), "a row past the span sees the span"


def test_reference_is_per_request(gen):
    """A request's rows do not depend on the others: permuting the requests permutes the output."""
    d, ps = 128, 16
    q, k, v, table, last = paged_case(gen, [50, 3, 33, 120], [4, 1, 2, 4], 8, 2, 4, d, ps, torch.float64)
    out = pa.reference(q, k, v, table, ps, last, d ** -0.5)
    perm = torch.tensor([2, 0, 3, 1])
    again = pa.reference(q[perm], k, v, table[perm], ps, last[perm], d ** -0.5)
    assert torch.equal(again, out[perm])


def test_dispatch_writes_out_on_cpu(gen):
    """paged_decode_attention on the CPU runs the reference and writes `out` in place (bf16 too)."""
    d, ps, t = 64, 16, 3
    q, k, v, table, last = paged_case(gen, [20, 45], [3, 2], 8, 2, t, d, ps, torch.float32)
    for dtype in (torch.float32, torch.bfloat16):
        qd, kd, vd = q.to(dtype), k.to(dtype), v.to(dtype)
        out = torch.full((2, t, 8 * d), float("nan"), dtype=dtype)
        ws = pa.new_workspace(1, qd.shape, "cpu")
        assert not pa.uses_kernel(qd, kd)
        pa.paged_decode_attention(qd, kd, vd, table, ps, last, d ** -0.5, out, ws)
        want = pa.reference(qd, kd, vd, table, ps, last, d ** -0.5).to(dtype)
        assert torch.equal(out, want)


def test_page_table_checks(gen):
    """A visible key on a page outside the pool is an error naming the entry; entries of pages no
    key is visible on may hold anything."""
    d, ps = 64, 16
    q, k, v, table, last = paged_case(gen, [20, 40], [1, 1], 4, 2, 1, d, ps, torch.float32, spare_pages=0)
    pool_pages = k.shape[2] // ps
    assert table.shape == (2, 3) and table[0, 2] == -1          # request 0 uses 2 pages of 3
    table[0, 2] = 10 ** 6                                      # not visible: fine
    pa.reference(q, k, v, table, ps, last, 0.1)
    for bad in (pool_pages, -1):
        broken = table.clone()
        broken[1, 1] = bad
        with pytest.raises(ValueError, match=r"page_table\[1, 1\] = .* outside the pool"):
            pa.reference(q, k, v, broken, ps, last, 0.1)


def test_rejects_bad_arguments(gen):
    d, ps = 64, 16
    q, k, v, table, last = paged_case(gen, [20, 40], [2, 2], 4, 2, 2, d, ps, torch.float32)
    out = torch.empty(2, 2, 4 * d)
    ws = pa.new_workspace(1, q.shape, "cpu")
    call = lambda **kw: pa.paged_decode_attention(
        **{**dict(q=q, k_pool=k, v_pool=v, page_table=table, page_size=ps, last=last, scale=0.1, out=out,
                  workspace=ws), **kw})
    cases = [
        (dict(q=q[0]), "q must be"),
        (dict(k_pool=k[..., :32]), "k_pool must be"),
        (dict(v_pool=v[:, :1]), "v_pool shape"),
        (dict(q=q[:, :3]), "multiple of Hkv"),
        (dict(k_pool=k.double()), "k_pool is"),
        (dict(page_size=12), "page_size must be a power of two"),
        (dict(page_size=True), "page_size must be"),
        (dict(k_pool=k[:, :, :-8], v_pool=v[:, :, :-8]), "multiple of page_size"),
        (dict(page_table=table.long()), "page_table must be an int32"),
        (dict(page_table=table[:1]), "page_table must be"),
        (dict(last=last.int()), "last must be an int64"),
        (dict(last=last[:, :1]), "last must be"),
        (dict(out=out[:, :1]), "out must be"),
        (dict(workspace=ws[..., :4]), "workspace must be"),
        (dict(workspace=pa.new_workspace(129, q.shape, "cpu")), "workspace must be"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            call(**kwargs)
