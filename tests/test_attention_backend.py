"""The attention backends of models/attention_backend.py agree (fp32, CPU), and the engine with
the "matmul" backend still decodes exactly as stock."""
import pytest
import torch

from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import Pair, fresh_seed
from specpilot.models.attention_backend import BACKENDS, masked_attention, set_attention_backend
from specpilot.models.layers import attention_mask


@pytest.fixture
def restore_backend():
    yield
    set_attention_backend("auto")


def test_backends_agree_fp32(restore_backend):
    g = torch.Generator().manual_seed(fresh_seed())
    q, k, v = (torch.randn(1, 2, r, 16, generator=g) for r in (6, 40, 40))
    mask = attention_mask(torch.tensor([30, 31, 32]), 40, 2, torch.float32)        # [1, 1, 6, 40]
    outs = {}
    for name in ("auto", "math", "matmul"):
        set_attention_backend(name)
        outs[name] = masked_attention(q, k, v, mask, 0.25)
    for name in ("math", "matmul"):
        torch.testing.assert_close(outs[name], outs["auto"], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="attention backend"):
        set_attention_backend("nope")
    assert "matmul" in BACKENDS


def test_engine_with_matmul_attention_equals_stock(tmp_path, restore_backend):
    from specpilot.verify.stock import run_stock

    pair = Pair(tmp_path, "tiny-qwen3", [0, 2], block_size=4, seed=fresh_seed())
    set_attention_backend("matmul")
    prompt = pair.random_prompt(12)
    ref = run_stock(pair.stock, prompt, 25, (), 0.0, None)
    ours = pair.engine.generate_spec(prompt, 25)
    assert ours.tokens == ref.tokens and ours.acceptance_lengths == ref.acceptance_lengths
