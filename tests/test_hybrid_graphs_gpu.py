"""CUDA-graphed steps of hybrid recurrent targets (engine/hybrid_graphs.py) on the GPU: each graphed
AR / verify step equals the eager forward at the same kv span bit for bit (logits, the per-position
states and conv windows it leaves, and after the last commit the committed state and KV), on random
hybrids in bf16 (torch reference and our kernels) and on the zoo's hybrid-tiny; graphed generations
equal eager ones (fp32) and warmup captures every graph they need; the zoo pair passes the verdict
with graphs on. Skipped on CPU."""
import dataclasses

import pytest
import torch

from conftest import requires_gpu
from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import fresh_seed
from test_hybrid_engine import OracleDrafts
from specpilot import settings

pytestmark = requires_gpu
BLOCK = 16
ZOO = settings.get().zoo


def random_hybrid(kind: str, dtype):
    from specpilot.models.random_ckpt import HYBRID_PRESETS, random_target

    cfg = HYBRID_PRESETS["tiny-qwen3.5-27b" if kind == "kernels-27b" else "tiny-qwen3.5"]
    if kind.startswith("kernels"):      # widths our GDN chain and decode attention kernels take
        cfg = dataclasses.replace(cfg, linear_key_head_dim=64, linear_value_head_dim=64, head_dim=64)
    return random_target(cfg, "cuda", dtype, seed=fresh_seed())


def zoo_target():
    if not (ZOO / "hybrid-tiny").is_dir():
        pytest.skip("the zoo's hybrid-tiny pair is not here")
    from specpilot.models import load_target

    return load_target(ZOO / "hybrid-tiny", device="cuda", dtype=torch.bfloat16)


@pytest.mark.parametrize("kind", ["reference", "kernels", "kernels-27b", "zoo"])   # 27b: its head groups
@torch.inference_mode()
def test_graphed_steps_equal_eager_bitwise(kind):
    from specpilot.config import EngineConfig
    from specpilot.engine import Engine
    from specpilot.engine.graphs import kv_bucket

    target = zoo_target() if kind == "zoo" else random_hybrid(kind, torch.bfloat16)
    graphed, eager = (Engine(target, None, max_seq_len=600, config=EngineConfig(cuda_graphs=on))
                      for on in (True, False))
    assert graphed.use_graphs and graphed.runner.hybrid is not None and not eager.use_graphs
    seed = fresh_seed()
    gen, host = torch.Generator(device="cuda").manual_seed(seed), torch.Generator().manual_seed(seed)
    vocab = target.config.vocab_size
    start = 245                                               # the steps cross the 256-slot kv bucket
    prompt = torch.randint(0, vocab, (1, start), device="cuda", generator=gen)
    for engine in (graphed, eager):
        engine.runner.prefill(prompt, with_features=False)
    for step in range(16):
        t = 1 if step % 3 == 0 else BLOCK
        ids = torch.randint(0, vocab, (1, t), device="cuda", generator=gen)
        ours, _ = graphed.runner.target_step(ids, start, with_features=False)
        span = kv_bucket(start + t, graphed.runner.capacity)
        ref, _ = eager.runner.forward_target(ids, torch.arange(start, start + t, device="cuda"), span, False)
        assert torch.equal(ours, ref), f"step {step} (T={t}, span {span}): logits differ"
        for j in range(len(graphed.cache.conv)):
            assert torch.equal(graphed.cache.snapshots[j], eager.cache.snapshots[j]), f"step {step}: states"
            assert torch.equal(graphed.cache.windows[j], eager.cache.windows[j]), f"step {step}: conv window"
        start += int(torch.randint(1, t + 1, (1,), generator=host))          # accept a prefix
    assert len({key[3] for key in graphed.runner.graphs}) == 2               # both kv spans were replayed
    for engine in (graphed, eager):
        engine.cache.commit(start)
    for a, b in zip(graphed.cache.state + graphed.cache.conv, eager.cache.state + eager.cache.conv):
        assert torch.equal(a, b)
    for a, b in zip(graphed.cache.k + graphed.cache.v, eager.cache.k + eager.cache.v):
        assert torch.equal(a[:, :, :start], b[:, :, :start])


@pytest.fixture(scope="module")
def fp32_pair(tmp_path_factory):
    from specpilot.config import EngineConfig
    from specpilot.engine import Engine
    from specpilot.models import load_drafter, load_target
    from specpilot.models.random_ckpt import write_pair

    t, d = write_pair(tmp_path_factory.mktemp("hybridgraph"), "tiny-qwen3.5", layer_ids=[0, 2], block_size=8,
                      seed=fresh_seed())
    target = load_target(t, device="cuda", dtype=torch.float32)
    drafter = load_drafter(d, target)
    return tuple(Engine(target, drafter, max_seq_len=600, config=EngineConfig(cuda_graphs=on)) for on in (True, False))


def test_graphed_generation_equals_eager_and_warmup_captures_all(fp32_pair):
    graphed, eager = fp32_pair
    assert graphed.warmup() > 0
    captured = set(graphed.runner.graphs)
    assert {k[0] for k in captured} == {"draft", "target"} and not graphed.runner.fused.graphs
    g = torch.Generator().manual_seed(fresh_seed())
    vocab = graphed.target.config.vocab_size
    for length, max_new in ((5, 40), (200, 70), (300, 257)):         # spans several kv buckets, tails
        prompt = torch.randint(0, vocab - 2, (length,), generator=g).tolist()
        ar = graphed.generate_ar(prompt, max_new).tokens
        assert ar == eager.generate_ar(prompt, max_new).tokens
        assert graphed.generate_spec(prompt, max_new).tokens == eager.generate_spec(prompt, max_new).tokens == ar
        forced = graphed.generate_spec(prompt, max_new, replay=OracleDrafts(ar, vocab))   # every accepted count
        assert forced.tokens == ar and len(set(forced.acceptance_lengths)) > 2
    assert set(graphed.runner.graphs) == captured        # warmup captured everything generation needed


def test_zoo_pair_passes_the_verdict_with_graphs():
    """hybrid-tiny in bf16, graphed: token-forced against the target's own greedy AR (referee rule)."""
    from specpilot.config import EngineConfig
    from specpilot.engine import Engine
    from specpilot.models import load_pair
    from specpilot.models.prompts import encode_prompt, read_prompts
    from specpilot.verify.forcing import token_force
    from specpilot.verify.stock import load_stock

    zoo_target()                                          # skips without the pair
    tdir, ddir = ZOO / "hybrid-tiny", ZOO / "hybrid-tiny-dflash-b16"
    target, drafter, tok = load_pair(tdir, ddir, device="cuda", dtype=torch.bfloat16)
    prompts = [encode_prompt(tok, row) for row in read_prompts(ZOO / "prompts" / "humaneval.jsonl", limit=4)]
    engine = Engine(target, drafter, max_seq_len=1024, config=EngineConfig(cuda_graphs=True))
    report = token_force(engine, load_stock(tdir, ddir, "cuda", torch.bfloat16), prompts, 128,
                         stop_ids=target.eos_token_ids)
    assert {k[1] for k in engine.runner.graphs if k[0] == "target"} >= {1, 16}     # graphed AR and verify
    assert report.passed and report.reasons == [], report.summary()
