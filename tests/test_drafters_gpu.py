"""DFlash2, DSpark and PARD on CUDA (fp32, CUDA graphs on: the target's steps and the greedy draft
steps): the same tokens and acceptance lengths as their stock / reference loops
on the GPU and as the eager engine; warmup captures every graph generation uses. Skipped without a
GPU."""
import pytest
import torch

from conftest import requires_gpu
from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import fresh_seed

pytestmark = requires_gpu
pytest.importorskip("dflash", reason="stock dflash 0.1.0 is not installed")


@pytest.mark.parametrize("kind", ["dflash2", "dspark", "pard"])
def test_kind_on_cuda_matches_reference_and_eager(tmp_path, kind):
    from specpilot.config import EngineConfig
    from specpilot.engine import Engine
    from specpilot.models import load_drafter, load_target
    from specpilot.models.drafters.random_kinds import write_kind_pair
    from specpilot.verify.stock import load_stock, run_stock

    t, d = write_kind_pair(tmp_path, kind, "tiny-qwen3", layer_ids=[0, 2], block_size=8, seed=fresh_seed())
    target = load_target(t, device="cuda", dtype=torch.float32)
    drafter = load_drafter(d, target)
    graphed = Engine(target, drafter, max_seq_len=600, config=EngineConfig(cuda_graphs=True))
    eager = Engine(target, drafter, max_seq_len=600, config=EngineConfig(cuda_graphs=False))
    stock = load_stock(t, d, "cuda", torch.float32)
    assert graphed.warmup() > 0
    captured = set(graphed.runner.graphs)
    assert {k[0] for k in captured} == {"target", kind}
    g = torch.Generator().manual_seed(fresh_seed())
    for length, max_new in ((5, 40), (200, 70)):
        prompt = torch.randint(0, 318, (length,), generator=g).tolist()
        ref = run_stock(stock, prompt, max_new, (), 0.0, None)
        a, b = graphed.generate_spec(prompt, max_new), eager.generate_spec(prompt, max_new)
        assert a.tokens == ref.tokens == b.tokens == eager.generate_ar(prompt, max_new).tokens
        assert a.acceptance_lengths == ref.acceptance_lengths == b.acceptance_lengths
    assert set(graphed.runner.graphs) == captured        # warmup captured everything generation needed
