"""AttentionMask plumbing (CPU): the additive mask and `last` describe the same visibility, CPU /
fp32 calls never reach the decode kernel, and the "specpilot" backend falls back to SDPA there
bit for bit."""
import pytest
import torch

from conftest import configured
from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import fresh_seed
from specpilot.kernels import decode_attention as kernel
from specpilot.ops.attention import AttentionMask, masked_attention, use_decode_kernel
from specpilot.ops.attention import attend, attention_mask


def kernel_visibility(last, span, groups):
    """The decode kernel's rule, folded like `attend`'s rows (j*T + t): slot s visible iff s <= last[t]."""
    slots = torch.arange(span)
    return (slots[None, :] <= last[:, None]).repeat(groups, 1)


def test_additive_mask_and_last_agree_over_random_steps():
    g = torch.Generator().manual_seed(fresh_seed())
    for _ in range(200):
        span = int(torch.randint(1, 300, (1,), generator=g))
        t = int(torch.randint(1, 20, (1,), generator=g))
        groups = int(torch.randint(1, 5, (1,), generator=g))
        start = int(torch.randint(0, span, (1,), generator=g))
        positions = torch.arange(start, start + t)
        # Padded rows sit at a trash slot that may lie beyond the span (the fused spec step).
        pad = torch.rand(t, generator=g) < 0.2
        positions = torch.where(pad, torch.full_like(positions, span + 7), positions)
        slots = torch.arange(span)
        # target: causal, last = positions
        m = attention_mask(positions, span, groups, torch.float32)
        assert torch.equal(m.additive[0, 0] == 0, (slots[None, :] <= positions[:, None]).repeat(groups, 1))
        assert torch.equal(m.additive[0, 0] == 0, kernel_visibility(m.last, span, groups))
        assert torch.isneginf(m.additive[0, 0][m.additive[0, 0] != 0]).all()
        # drafter: one last slot for every row, non-causal
        for last in (positions[-1:], torch.tensor([int(torch.randint(-1, span + 3, (1,), generator=g))])):
            m = attention_mask(last.expand(t), span, groups, torch.bfloat16)
            assert m.last.shape == (t,) and m.last.dtype == torch.int64 and m.last.is_contiguous()
            assert torch.equal(m.additive[0, 0] == 0, (slots <= last).expand(t, span).repeat(groups, 1))
            assert torch.equal(m.additive[0, 0] == 0, kernel_visibility(m.last, span, groups))


def test_additive_mask_is_built_only_when_used(monkeypatch):
    """A step our kernel runs end to end never needs the additive mask: attention_mask launches
    nothing for it until `.additive` is read, then builds it once; built() builds it at once."""
    calls = []
    real_zeros = torch.zeros
    monkeypatch.setattr(torch, "zeros", lambda *a, **k: calls.append(a) or real_zeros(*a, **k))
    m = attention_mask(torch.tensor([5, 6]), 8, 2, torch.float32)
    assert calls == [] and torch.equal(m.last, torch.tensor([5, 6]))
    first = m.additive
    assert len(calls) == 1 and m.additive is first and first.shape == (1, 1, 4, 8)
    m2 = attention_mask(torch.tensor([5, 6]), 8, 2, torch.float32).built()
    assert len(calls) == 2 and torch.equal(m2.additive, first)


def test_attend_with_attention_mask_is_unchanged_on_cpu():
    """CPU (fp32 and bf16) never takes the kernel: attend gives the bits of SDPA on the additive mask,
    under "auto" and "specpilot" alike; masked_attention accepts both mask forms."""
    g = torch.Generator().manual_seed(fresh_seed())
    for dtype in (torch.float32, torch.bfloat16):
        q = torch.randn(1, 4, 3, 64, generator=g).to(dtype)
        k, v = (torch.randn(1, 2, 40, 64, generator=g).to(dtype) for _ in range(2))
        positions = torch.tensor([30, 31, 32])
        mask = attention_mask(positions, 40, 2, dtype)
        folded = q.reshape(1, 2, 6, 64)
        ref = torch.nn.functional.scaled_dot_product_attention(folded, k, v, attn_mask=mask.additive, scale=0.125)
        ref = ref.reshape(1, 4, 3, 64).transpose(1, 2).reshape(1, 3, 256)
        for backend in ("auto", "specpilot", "sdpa"):
            with configured(attention=backend):
                assert not use_decode_kernel(q, k, mask)
                assert torch.equal(attend(q, k, v, mask, 0.125), ref)
                assert torch.equal(masked_attention(folded, k, v, mask, 0.125),
                                   masked_attention(folded, k, v, mask.additive, 0.125))


def test_kernel_dispatch_rules():
    q = torch.zeros(1, 8, 1, 64, dtype=torch.bfloat16)
    k = torch.zeros(1, 2, 256, 64, dtype=torch.bfloat16)
    mask = AttentionMask(torch.zeros(1, 1, 4, 256, dtype=torch.bfloat16), torch.zeros(1, dtype=torch.int64))
    assert not kernel.supports(q, k)                               # CPU
    with configured(attention="sdpa"):
        assert not use_decode_kernel(q, k, mask)
    assert not use_decode_kernel(q, k, AttentionMask(mask.additive, None))   # no `last`: SDPA
    assert not use_decode_kernel(q, k, mask.additive)                         # a bare additive mask


def test_default_splits_bounds():
    # Qwen3-8B shape on 132 SMs: 8 KV heads, T=1 (4 rows) and T=16 (64 rows): one CTA per SM at most.
    assert kernel.default_splits(1, 8, 4, 1024, 132) == 17
    assert kernel.default_splits(1, 8, 64, 1024, 132) == 17
    assert kernel.default_splits(1, 8, 128, 1024, 132) == 9        # 2 row blocks per KV head
    assert kernel.default_splits(1, 2, 4, 1024, 132) == 32         # capped: >= 32 keys per split at full span
    assert kernel.default_splits(1, 2, 4, 8192, 132) == 66
    assert kernel.default_splits(1, 2, 4, 16, 132) == 1
    assert kernel.default_splits(64, 8, 256, 4096, 132) == 1
    assert kernel.default_splits(1, 1, 1, 1 << 20, 1000) == kernel.MAX_SPLITS


def test_auto_takes_the_kernel_for_every_supported_call(monkeypatch):
    """"auto" and "specpilot" (attention_backend docstring): every call the kernel supports, at any
    T and span; "sdpa" never."""
    monkeypatch.setattr(kernel, "supports", lambda q, k: True)
    monkeypatch.setattr(kernel, "available", lambda: True)

    def takes(t, span):
        q, k = torch.zeros(1, 4, t, 8), torch.zeros(1, 2, span, 8)
        return use_decode_kernel(q, k, AttentionMask(torch.zeros(1), torch.zeros(t, dtype=torch.long)))

    assert takes(1, 1024) and takes(1, 64)                         # the default, "auto"
    assert takes(16, 1024) and takes(16, 8192)
    with configured(attention="specpilot"):
        assert takes(16, 1024)
    with configured(attention="sdpa"):
        assert not takes(1, 1024)
