"""split12 format v1: reference pack/unpack is bit-exact for every bf16 pattern, and the C++
packer / unpacker agree with it byte for byte."""
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specpilot.formats.split12 import ops, reference as ref

SPECIALS = [0x0000, 0x8000, 0x0001, 0x8001, 0x007F, 0x807F, 0x0080, 0x7F7F, 0xFF7F,  # ±0, subnormals, min/max normal
            0x7F80, 0xFF80, 0x7FC0, 0xFFC0, 0x7F81, 0xFFFF, 0x7FA5, 0x3F80, 0xBF80]  # ±inf, NaN payloads, ±1


@pytest.fixture
def gen():
    """A generator seeded differently on every run (conftest's gen cannot carry its seed)."""
    seed = int.from_bytes(os.urandom(4), "little")
    g = torch.Generator().manual_seed(seed)
    print(f"seed {seed}")  # shown by pytest when a test fails
    return g


def bits_to_bf16(bits: torch.Tensor) -> torch.Tensor:
    return bits.to(torch.int32).to(torch.int16).view(torch.bfloat16)  # keeps the low 16 bits


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype == torch.bfloat16 and torch.equal(a.view(torch.int16), b.view(torch.int16))


@st.composite
def bf16_matrices(draw):
    """Random [N, K] bf16 bit patterns: uniform over all 65536, or weight-like with specials mixed in."""
    n, k = draw(st.integers(1, 9)), draw(st.integers(1, 80))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    if draw(st.booleans()):
        bits = torch.randint(0, 65536, (n, k), generator=g)
    else:
        scale = 2.0 ** draw(st.integers(-30, 10))
        bits = (torch.randn(n, k, generator=g) * scale).to(torch.bfloat16).view(torch.int16).to(torch.int32) & 0xFFFF
        specials = torch.tensor(SPECIALS)
        mask = torch.rand(n, k, generator=g) < draw(st.sampled_from([0.0, 0.05, 0.5]))
        bits = torch.where(mask, specials[torch.randint(0, len(SPECIALS), (n, k), generator=g)], bits)
    return bits_to_bf16(bits)


@settings(max_examples=60, deadline=None)
@given(bf16_matrices())
def test_reference_round_trip_is_bit_exact(w):
    p = ref.pack(w).validate()
    assert same_bits(ref.unpack(p), w)
    assert p.lo.shape == (w.shape[0], ref.round_up_kpad(w.shape[1]))


@settings(max_examples=60, deadline=None)
@given(bf16_matrices())
def test_cpp_pack_matches_reference_and_unpacks_exactly(w):
    expect = ref.pack(w)
    got = ops.pack(w)
    for name in ref.PLANES:
        assert torch.equal(getattr(got, name), getattr(expect, name)), name
    assert same_bits(ops.unpack(got), w)
    assert same_bits(ops.unpack(expect), w)


def test_every_bf16_pattern_round_trips():
    # All 65536 patterns as one [256, 256] matrix and transposed, so rows see all exponents.
    w = bits_to_bf16(torch.arange(65536).view(256, 256))
    for m in (w, w.t().contiguous()):
        assert same_bits(ref.unpack(ref.pack(m)), m)
        assert same_bits(ops.unpack(ops.pack(m)), m)


def test_base_minimises_escapes_and_padding_is_zero(gen):
    g = gen
    w = (torch.randn(24, 45, generator=g) * 2.0 ** torch.randint(-20, 5, (24, 1), generator=g)).to(torch.bfloat16)
    p = ref.pack(w)
    half_exp = (w.view(torch.int16).to(torch.int32) >> 8) & 0x7F  # e >> 1
    for n in range(w.shape[0]):
        outside = [int(((half_exp[n] < b) | (half_exp[n] > b + 7)).sum()) for b in range(ref.MAX_BASE + 1)]
        best = min(outside)
        assert int(p.esc_rowptr[n + 1] - p.esc_rowptr[n]) == best
        assert int(p.base[n]) == outside.index(best)  # smallest base on ties
    assert not p.lo[:, 45:].any() and not p.codes[:, 48 // 2:].any()  # kpad 64: columns 45..63 zero
    # codes of columns 45..47 (group 5) are zero nibbles too
    for k in range(45, 48):
        assert (p.codes[:, (k // 8) * 4 + (k % 8) % 4] >> (0 if k % 8 < 4 else 4)).bitwise_and(15).eq(0).all()


def test_escaped_code_keeps_the_sign_with_class_zero(gen):
    w = (torch.randn(4, 64, generator=gen) * 0.02).to(torch.bfloat16)
    w[1, 7], w[2, 33] = 0.0, -1e-30  # far outside the row window
    p = ref.pack(w)
    for n, k, sign in ((1, 7, 0), (2, 33, 1)):
        code = (int(p.codes[n, (k // 8) * 4 + (k % 8) % 4]) >> (0 if k % 8 < 4 else 4)) & 15
        assert code == sign << 3
        row_cols = p.esc_col[p.esc_rowptr[n]:p.esc_rowptr[n + 1]].tolist()
        assert k in row_cols and row_cols == sorted(row_cols)


def test_malformed_planes_are_refused(gen):
    p = ref.pack((torch.randn(3, 40, generator=gen) * 0.02).to(torch.bfloat16))
    bad = ref.Split12Tensor(**{**p.planes(), "esc_col": torch.tensor([99], dtype=torch.int32),
                               "esc_val": torch.tensor([0], dtype=torch.int16),
                               "esc_rowptr": torch.tensor([0, 1, 1, 1], dtype=torch.int32)}, N=3, K=40)
    try:
        bad.validate()
    except ValueError as e:
        assert "esc_col" in str(e) and "K=40" in str(e)
    else:
        raise AssertionError("an escape column >= K was accepted")
    wrong_dtype = ref.Split12Tensor(**{**p.planes(), "lo": p.lo.to(torch.int32)}, N=3, K=40)
    try:
        wrong_dtype.validate()
    except ValueError as e:
        assert "lo" in str(e) and "torch.int32" in str(e)
    else:
        raise AssertionError("an int32 lo plane was accepted")
