"""weights="split12" through the engine: the split12 pair (the drafter follows its target) and its
Bf16Linear twin (same kernel order) give bit-identical logits and tokens (CPU here; on CUDA the AR step uses the simt kernel and
verify / draft steps the skinny GEMM or the mma.sync one, see engine/linear_kernels.py), and the
engine's choice of kernel by row count."""
import pytest
import torch

from conftest import configured
from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import fresh_seed


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    from specpilot.engine import Engine
    from specpilot.formats.split12.linear import Split12Linear, swap_linears
    from specpilot.models import load_drafter, load_target
    from specpilot.models.random_ckpt import write_pair

    t, d = write_pair(tmp_path_factory.mktemp("s12"), "tiny-qwen3", layer_ids=[0, 2], block_size=4,
                      seed=fresh_seed())
    s12 = load_target(t, dtype=torch.bfloat16, weights="split12")
    twin = load_target(t, dtype=torch.bfloat16)
    swap_linears(twin, kind="bf16")
    drafters = [load_drafter(d, s12), load_drafter(d, twin)]   # the first follows its target: split12
    swap_linears(drafters[1], kind="bf16")
    for model in (s12, drafters[0]):
        assert any(isinstance(m, Split12Linear) for m in model.modules())
    return [Engine(m, drafter, max_seq_len=256) for m, drafter in zip((s12, twin), drafters)]


def test_split12_and_twin_logits_bit_identical(engines):
    g = torch.Generator().manual_seed(fresh_seed())
    prompt = torch.randint(0, 300, (1, 21), generator=g)
    for e in engines:
        e.runner.prefill(prompt, with_features=True)
    for step in range(3):
        ids = torch.randint(0, 300, (1, 4), generator=g)
        pos = 21 + 4 * step
        ar = [e.runner.target_step(ids[:, :1], pos, with_features=False)[0].clone() for e in engines]
        ver = [e.runner.target_step(ids, pos, with_features=True)[0].clone() for e in engines]
        assert torch.equal(ar[0], ar[1]) and torch.equal(ver[0], ver[1])


def test_split12_engine_tokens_equal_twin(engines):
    prompt = torch.randint(0, 300, (15,), generator=torch.Generator().manual_seed(fresh_seed())).tolist()
    spec = [e.generate_spec(prompt, 20) for e in engines]
    ar = [e.generate_ar(prompt, 12) for e in engines]
    assert spec[0].tokens == spec[1].tokens and spec[0].acceptance_lengths == spec[1].acceptance_lengths
    assert ar[0].tokens == ar[1].tokens


@pytest.mark.parametrize("skinny_on,built,in_features,rows,want", [
    (True, True, 64, 1, "simt"), (True, True, 64, 2, "skinny"), (True, True, 64, 16, "skinny"),
    (True, True, 64, 17, "dense"), (False, True, 64, 40, "dense"), (True, True, 60, 8, "tc"), (False, True, 64, 8, "tc"),
    (True, False, 64, 8, "tc"), (False, False, 64, 1, "simt")])
def test_kernel_for_rows(monkeypatch, skinny_on, built, in_features, rows, want):
    """One row: the CUDA-core GEMV; 2..16 rows: the skinny GEMM while it is on, built, and K % 8 == 0,
    otherwise the mma.sync kernel; more rows: decode + torch's GEMM."""
    from specpilot.engine.linear_kernels import kernel_for, linear_kernel_for_rows
    from specpilot.formats.split12.linear import Bf16Linear
    from specpilot.ops import linear as ops_linear

    monkeypatch.setattr(ops_linear, "skinny_available", lambda: built)
    with configured(skinny_gemm=skinny_on):
        m = Bf16Linear(torch.zeros(8, in_features, dtype=torch.bfloat16))
        assert kernel_for(m, rows) == want
        with linear_kernel_for_rows([m], rows):
            assert m.kernel == want
        assert m.kernel == "simt"  # restored


def test_drafter_weights_follow_the_target_unless_told(tmp_path):
    from specpilot.models import load_drafter, load_target
    from specpilot.models.loading import weights_of
    from specpilot.models.random_ckpt import write_pair

    t, d = write_pair(tmp_path, "tiny-qwen3", layer_ids=[0, 2], block_size=4, seed=fresh_seed())
    s12, plain = load_target(t, dtype=torch.bfloat16, weights="split12"), load_target(t, dtype=torch.bfloat16)
    assert weights_of(load_drafter(d, s12)) == "split12"
    assert weights_of(load_drafter(d, plain)) == "bf16"
    assert weights_of(load_drafter(d, s12, weights="bf16")) == "bf16"
    with pytest.raises(ValueError, match="weights='int4'"):
        load_drafter(d, s12, weights="int4")
