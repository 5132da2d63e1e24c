"""The agents' kernel plumbing: device-side packing equals the reference packer, the JIT cache is
keyed by source hash, the CPU twins decode bit-exactly."""
import shutil

import pytest
import torch

from specpilot.formats.split12 import reference
from specpilot.kernels import jit
from specpilot.kernels.variants.split12_args import pack, unpack
from specpilot.kernels.variants.split12_gemv_cuda import GemvParams, render


def _weights(n, k):
    w = (torch.randn(n, k) * torch.exp2(torch.randint(-20, 20, (n, 1)).float())).to(torch.bfloat16)
    bits = w.view(torch.int16)
    bits[0, 0], bits[-1, -1] = 0x0001, -0x8000         # a subnormal and -0: escapes
    w[n // 2, k // 2] = float("inf")
    return w


@pytest.mark.parametrize("shape", [(1, 1), (7, 33), (64, 96), (33, 200)])
def test_pack_matches_the_reference_planes_and_round_trips(shape):
    w = _weights(*shape)
    mine, ref = pack(w), reference.pack(w)
    for name in reference.PLANES:
        assert torch.equal(getattr(mine, name), getattr(ref, name)), name
    assert torch.equal(unpack(mine).view(torch.int16), w.view(torch.int16))


def test_pack_refuses_non_bf16():
    with pytest.raises(ValueError, match="bf16"):
        pack(torch.zeros(2, 2))


def test_template_params_are_validated():
    with pytest.raises(ValueError, match="threads_per_row=48"):
        render(GemvParams(48, 1, 1, 1))
    with pytest.raises(ValueError, match="vec_groups=3"):
        render(GemvParams(32, 1, 3, 1))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed on this machine")
def test_jit_cache_is_keyed_by_source_hash(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPILOT_KERNEL_CACHE", str(tmp_path / "k"))
    src = render(GemvParams(32, 4, 2, 1))
    first = jit.compile_cubin(src, prefer="nvcc")
    again = jit.compile_cubin(src, prefer="nvcc")
    other = jit.compile_cubin(src.replace("#define VEC 2", "#define VEC 4"), prefer="nvcc")
    assert not first.cached and again.cached and again.path == first.path
    assert first.path.parent == tmp_path / "k" and first.path.stat().st_size > 0
    assert other.key != first.key and not other.cached
    with pytest.raises(RuntimeError, match="build failed"):
        jit.compile_cubin(src.replace("acc = 0.f;", "acc = undefined_name;"), prefer="nvcc")


def _byte_perm(x: int, y: int, s: int) -> int:
    """CUDA __byte_perm (default mode): result byte i = byte (s >> 4i) & 7 of {y:x}."""
    src = [(x >> (8 * i)) & 0xFF for i in range(4)] + [(y >> (8 * i)) & 0xFF for i in range(4)]
    return sum(src[(s >> (4 * i)) & 7] << (8 * i) for i in range(4))


def test_tiled_template_decode_arithmetic_matches_the_contract():
    # the word-level decode of sp_group_dot (one add per 4 weights, two byte_perms per 4 weights),
    # replayed in Python on a packed random row: every in-window weight comes out bit-exact
    w = _weights(3, 64)
    a = pack(w)
    lo, codes = a.lo.numpy(), a.codes.numpy()
    escaped = set()
    for n in range(a.N):
        for p in range(int(a.esc_rowptr[n]), int(a.esc_rowptr[n + 1])):
            escaped.add((n, int(a.esc_col[p])))
    bits = w.view(torch.int16).to(torch.int32) & 0xFFFF
    for n in range(a.N):
        base4 = int(a.base[n]) * 0x01010101
        for g in range(a.K // 8):
            cw = int.from_bytes(codes[n, g * 4:g * 4 + 4].tobytes(), "little")
            l0 = int.from_bytes(lo[n, g * 8:g * 8 + 4].tobytes(), "little")
            l1 = int.from_bytes(lo[n, g * 8 + 4:g * 8 + 8].tobytes(), "little")
            n_lo, n_hi = cw & 0x0F0F0F0F, (cw >> 4) & 0x0F0F0F0F
            h0 = ((n_lo & 0x07070707) + base4) | ((n_lo & 0x08080808) << 4)
            h1 = ((n_hi & 0x07070707) + base4) | ((n_hi & 0x08080808) << 4)
            pairs = [_byte_perm(l0, h0, 0x5140), _byte_perm(l0, h0, 0x7362),
                     _byte_perm(l1, h1, 0x5140), _byte_perm(l1, h1, 0x7362)]
            for j in range(8):
                got = (pairs[j // 2] >> (16 * (j % 2))) & 0xFFFF
                if (n, g * 8 + j) not in escaped:
                    assert got == int(bits[n, g * 8 + j]), (n, g, j)
