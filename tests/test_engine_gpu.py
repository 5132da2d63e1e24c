"""The engine on CUDA (CUDA graphs on): same tokens as stock dflash_generate and as eager mode.
Runs on the H200 (`python -m pytest -q tests/test_engine_gpu.py`); skipped on CPU."""
import pytest
import torch

from conftest import configured, requires_gpu
from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import fresh_seed, loop_config

pytestmark = requires_gpu
dflash = pytest.importorskip("dflash", reason="stock dflash 0.1.0 is not installed")


@pytest.fixture(scope="module")
def cuda_pair(tmp_path_factory):
    from specpilot.config import EngineConfig
    from specpilot.engine import Engine
    from specpilot.models import load_drafter, load_target
    from specpilot.models.random_ckpt import write_pair
    from specpilot.verify.stock import load_stock

    t, d = write_pair(tmp_path_factory.mktemp("gpu"), "tiny-qwen3", layer_ids=[0, 2], block_size=8, seed=fresh_seed())
    target = load_target(t, device="cuda", dtype=torch.float32)
    drafter = load_drafter(d, target)
    graphed = Engine(target, drafter, max_seq_len=600, config=EngineConfig(cuda_graphs=True))
    eager = Engine(target, drafter, max_seq_len=600, config=EngineConfig(cuda_graphs=False))
    return graphed, eager, load_stock(t, d, "cuda", torch.float32)


def test_graphs_are_used_and_match_stock_and_eager(cuda_pair):
    from specpilot.verify.stock import run_stock

    graphed, eager, stock = cuda_pair
    assert graphed.use_graphs and not eager.use_graphs
    assert graphed.warmup() > 0
    captured, fused = set(graphed.runner.graphs), set(graphed.runner.fused.graphs)
    assert {k[0] for k in fused} == {"ar", "spec"}
    g = torch.Generator().manual_seed(fresh_seed())
    for length, max_new in ((5, 40), (200, 70), (300, 257)):     # spans several kv buckets, tails
        prompt = torch.randint(0, 318, (length,), generator=g).tolist()
        ref = run_stock(stock, prompt, max_new, (), 0.0, None)
        a = graphed.generate_spec(prompt, max_new)
        b = eager.generate_spec(prompt, max_new)
        assert a.tokens == ref.tokens == b.tokens
        assert a.acceptance_lengths == ref.acceptance_lengths
        assert graphed.generate_ar(prompt, max_new).tokens == eager.generate_ar(prompt, max_new).tokens
        with loop_config(graphed, fused_steps=False):    # the stepwise graphs: same tokens
            assert graphed.generate_spec(prompt, max_new).tokens == ref.tokens
    assert set(graphed.runner.graphs) == captured        # warmup captured everything generation needed
    assert set(graphed.runner.fused.graphs) == fused
    assert {k[0] for k in captured} == {"draft", "target"}


def test_sampling_on_cuda_matches_stock(cuda_pair):
    from specpilot.verify.stock import run_stock

    graphed, _, stock = cuda_pair
    prompt = list(range(10, 30))
    seed = fresh_seed()
    a = graphed.generate_spec(prompt, 48, temperature=0.7, seed=seed)
    ref = run_stock(stock, prompt, 48, (), 0.7, None, seed=seed)
    assert a.tokens == ref.tokens


@pytest.mark.parametrize("skinny", [True, False])
def test_split12_engine_matches_bf16_twin_on_cuda(skinny):
    """weights="split12" on CUDA: graphed AR (simt kernel) and verify logits (the skinny GEMM, or the
    mma.sync kernel with the skinny GEMM off) bit-identical to the Bf16Linear twin's, and identical
    greedy tokens."""
    from specpilot.config import EngineConfig
    from specpilot.engine import Engine
    from specpilot.engine.linear_kernels import kernel_for
    from specpilot.formats.split12.linear import Split12Linear, swap_linears
    from specpilot.models import load_drafter, load_target
    from specpilot.models.random_ckpt import write_pair
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        t, d = write_pair(tmp, "tiny-qwen3", layer_ids=[0, 2], block_size=8, seed=fresh_seed())
        s12 = load_target(t, device="cuda", dtype=torch.bfloat16, weights="split12")
        twin = load_target(t, device="cuda", dtype=torch.bfloat16)
        swap_linears(twin, kind="bf16")
        engines = [Engine(m, load_drafter(d, m), max_seq_len=300, config=EngineConfig(skinny_gemm=skinny))
                   for m in (s12, twin)]
    linear = next(m for m in s12.modules() if isinstance(m, Split12Linear))
    with configured(skinny_gemm=skinny):
        assert kernel_for(linear, 8) == ("skinny" if skinny else "tc")
    _split12_and_twin_agree(engines)


def test_split12_prefill_and_verify_equal_the_plain_bf16_engine():
    """Prefill rows ("dense": decode + cuBLAS) and verify rows ("skinny") run the very GEMMs a plain
    bf16 model's nn.Linear runs, so a split12 engine's prefill and verify logits and features are
    the bf16 engine's bit for bit. (Its one-token step keeps its own lane-tree order, and the split12
    pair's decode-bound grid its own K cuts: not at these tiny shapes, checked below.)"""
    from specpilot.engine import Engine
    from specpilot.formats.split12.linear import Split12Linear
    from specpilot.formats.split12.ops import skinny_pair_ctas
    from specpilot.models import load_drafter, load_target
    from specpilot.models.random_ckpt import write_pair
    import tempfile

    from specpilot.ops import linear as ops_linear

    assert ops_linear.skinny_enabled()
    with tempfile.TemporaryDirectory() as tmp:
        t, d = write_pair(tmp, "tiny-qwen3", layer_ids=[0, 2], block_size=8, seed=fresh_seed())
        models = [load_target(t, device="cuda", dtype=torch.bfloat16, weights=w) for w in ("split12", "bf16")]
        engines = [Engine(m, load_drafter(d, m), max_seq_len=300) for m in models]
    assert all(skinny_pair_ctas(m.out_features, m.in_features, torch.device("cuda")) == 0
               for m in models[0].modules() if isinstance(m, Split12Linear))
    g = torch.Generator().manual_seed(fresh_seed())
    prompt = torch.randint(0, 300, (1, 40), generator=g).cuda()
    pre = [e.runner.prefill(prompt, with_features=True) for e in engines]
    assert torch.equal(pre[0][0], pre[1][0]) and torch.equal(pre[0][1], pre[1][1])
    for step in range(3):
        ids = torch.randint(0, 300, (1, 8), generator=g).cuda()
        ver = [[t.clone() for t in e.runner.target_step(ids, 40 + 8 * step, with_features=True)] for e in engines]
        assert torch.equal(ver[0][0], ver[1][0]) and torch.equal(ver[0][1], ver[1][1])


def _split12_and_twin_agree(engines):
    g = torch.Generator().manual_seed(fresh_seed())
    prompt = torch.randint(0, 300, (1, 40), generator=g).cuda()
    for e in engines:
        e.runner.prefill(prompt, with_features=True)
    for step in range(3):
        ids = torch.randint(0, 300, (1, 8), generator=g).cuda()
        pos = 40 + 8 * step
        ar = [e.runner.target_step(ids[:, :1], pos, with_features=False)[0].clone() for e in engines]
        ver = [e.runner.target_step(ids, pos, with_features=True)[0].clone() for e in engines]
        assert torch.equal(ar[0], ar[1]) and torch.equal(ver[0], ver[1])
    p = prompt[0, :20].tolist()
    a, b = (e.generate_spec(p, 40) for e in engines)
    assert a.tokens == b.tokens and a.acceptance_lengths == b.acceptance_lengths
