"""The agents' kernel plumbing: device-side packing equals the reference packer, the JIT cache is
keyed by source hash, the real CUDA templates decode every column bit-exactly (GPU)."""
import shutil

import pytest
import torch
from conftest import requires_gpu

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


@requires_gpu
@pytest.mark.parametrize("params", [GemvParams(), GemvParams(32, 4, 2, 1), GemvParams(8, 16, 4, 2),
                                    GemvParams(64, 2, 2, 4), GemvParams(256, 1, 1, 1)], ids=lambda p: p.label())
def test_cuda_templates_decode_every_column_bit_exactly(params, tmp_path, monkeypatch):
    # the real rendered template, launched: one-hot inputs over every column of a packed weight with
    # a subnormal, -0 and inf (escapes) must return that column exactly (the word-level decode)
    pytest.importorskip("cupy")
    monkeypatch.setenv("SPECPILOT_KERNEL_CACHE", str(tmp_path / "k"))
    from specpilot.agents.candidates import build_callable, gemv_candidate
    from specpilot.kernels.variants.split12_args import contract_args

    n, k = 37, 200
    w = _weights(n, k).cuda()
    a = pack(w)
    fn = build_callable(gemv_candidate((n, k), params.to_dict(), "test", "cuda"))
    eye = torch.eye(k, dtype=torch.bfloat16, device="cuda")
    y = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    for c in range(k):
        y.fill_(float("nan"))
        fn(*contract_args(a), eye[c].contiguous(), y, n, k, a.kpad)
        want = (w.float() @ eye[c].float()).to(torch.bfloat16)  # the inf row is NaN off its column (inf * 0)
        got, want = y.view(torch.int16), want.view(torch.int16)
        same = (got == want) | ((got & 0x7FFF) == 0) & ((want & 0x7FFF) == 0)  # +0 + (-0) sums to +0
        same |= torch.isnan(y) & torch.isnan(want.view(torch.bfloat16))
        assert bool(same.all()), f"column {c}: rows {(~same).nonzero().flatten()[:5].tolist()}"
