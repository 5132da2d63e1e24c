"""weights="split12" through the engine: the split12 target and its Bf16Linear twin (same kernel
order) give bit-identical logits and tokens (CPU here; on CUDA the AR step uses the simt kernel and
verify / draft steps the tensor-core one, see engine/linear_kernels.py)."""
import pytest
import torch

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
    assert any(isinstance(m, Split12Linear) for m in s12.modules())
    return [Engine(m, load_drafter(d, m), max_seq_len=256) for m in (s12, twin)]


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
