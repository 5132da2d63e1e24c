"""The two-level mechanisms on CUDA bf16 (docs/two_level.md), skipped on CPU:
- a reduced draft vocabulary through the graphed fused step (the CUDA draft-argmax kernel over -inf
  logits): the zoo pair passes token forcing against stock with drafts only from the kept set;
- the certified head's bound covers the GPU's own LM head GEMM (our skinny GEMM / cuBLAS, bf16 out):
  a certified row's winner is that GEMM's argmax;
- the certified head in the engine passes token forcing on the zoo pair."""
import json

import pytest
import torch

from conftest import requires_gpu
from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import fresh_seed
from specpilot import settings

pytestmark = requires_gpu
zoo = pytest.mark.skipif(settings.zoo_pair() is None, reason="the zoo pair (SPECPILOT_ZOO) is not present")
# Token forcing's excuse cap is estimated from the run itself (1% of the forced tokens, or a multiple of
# the positions where stock leaves the referee): 3 x 64 tokens gave a cap of 1 and a stock-flip count of
# 0 from too few positions to estimate anything. 8 x 128 is the scale of the measured zoo verify runs.
FORCED_PROMPTS, FORCED_TOKENS = 8, 128


@pytest.fixture(scope="module")
def zoo_cuda(tmp_path_factory):
    from specpilot.commands.draft_vocab import count_tokens
    from specpilot.models import load_drafter, load_target, load_tokenizer
    from specpilot.models.draft_vocab import TokenRanking
    from specpilot.models.prompts import encode_prompt, read_prompts
    from specpilot.verify.stock import load_stock

    tdir, ddir = settings.zoo_pair()
    tok = load_tokenizer(tdir)
    rows = read_prompts(tdir.parent / "prompts" / "pystdlib.jsonl")
    target = load_target(tdir, device="cuda", dtype=torch.bfloat16)
    counts = count_tokens([encode_prompt(tok, r) for r in rows[40:]], target.config.vocab_size)
    ranking = TokenRanking.from_counts(counts, "pystdlib[40:]")
    path = ranking.save(tmp_path_factory.mktemp("ranking") / "ranking.json")
    prompts = [encode_prompt(tok, r)[-96:] for r in rows[:FORCED_PROMPTS]]
    return target, load_drafter(ddir, target), load_stock(tdir, ddir, "cuda", torch.bfloat16), prompts, ranking, path


@zoo
def test_reduced_draft_vocab_passes_token_forcing_through_the_fused_step(zoo_cuda):
    from specpilot.config import EngineConfig
    from specpilot.engine import Engine
    from specpilot.verify.forcing import token_force

    target, drafter, stock, prompts, ranking, path = zoo_cuda
    engine = Engine(target, drafter, max_seq_len=512, config=EngineConfig(draft_vocab=1024, draft_vocab_ranking=str(path)))
    assert engine.use_graphs and engine.config.fused_steps
    report = token_force(engine, stock, prompts, FORCED_TOKENS, stop_ids=())
    assert report.passed, json.dumps(report.summary())   # a string: pytest prints it whole
    # live inside the captured step: 64 kept tokens move the acceptance lengths off the full head's
    full = Engine(target, drafter, max_seq_len=512)
    tiny = Engine(target, drafter, max_seq_len=512, config=EngineConfig(draft_vocab=64, draft_vocab_ranking=str(path)))
    moved = [full.generate_spec(p, 64, stop_ids=()).acceptance_lengths != tiny.generate_spec(p, 64, stop_ids=()).acceptance_lengths
             for p in prompts[:3]]
    assert any(moved), "draft_vocab=64 changed no acceptance length: is the reduced head in the graph?"


@pytest.mark.parametrize("rows", [1, 16])
def test_certified_winners_are_the_gpu_heads_argmax(rows):
    from torch import nn

    from specpilot import config
    from specpilot.config import EngineConfig
    from specpilot.engine.certified_head import HeadBounds, certify
    from specpilot.ops import linear

    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    v, h, trials = 4096, 512, 64
    head = nn.Linear(h, v, bias=False, device="cuda", dtype=torch.bfloat16)
    head.weight.data.copy_((torch.randn(v, h, generator=g) * 0.05).to(torch.bfloat16))
    bounds = HeadBounds.build(head.weight, h)
    certified_any = False
    for _ in range(trials):
        picks = torch.randint(0, v, (rows,), generator=g)
        x = (head.weight.float().cpu()[picks] * torch.rand(rows, 1, generator=g) * 40
             + torch.randn(rows, h, generator=g)).to("cuda", torch.bfloat16)
        with config.use(EngineConfig()), torch.inference_mode():
            exact = linear.linear(head, x[None])[0]                         # what the verify / AR step runs
        shortlist = torch.cat([picks[:, None], torch.randint(0, v, (rows, 7), generator=g)], dim=1).cuda()
        winner, certified = certify(x, shortlist, bounds, torch.bfloat16)
        assert torch.equal(winner[certified], exact.argmax(-1)[certified]), f"seed {seed}"
        certified_any |= bool(certified.any())
    assert certified_any, f"seed {seed}: nothing certified (the test would prove nothing)"


@zoo
def test_certified_head_engine_passes_token_forcing(zoo_cuda):
    from specpilot.config import EngineConfig
    from specpilot.engine import Engine
    from specpilot.verify.forcing import token_force

    target, drafter, stock, prompts, _, _ = zoo_cuda
    engine = Engine(target, drafter, max_seq_len=512, config=EngineConfig(two_level="certified-head"))
    report = token_force(engine, stock, prompts, FORCED_TOKENS, stop_ids=())
    assert report.passed, json.dumps(report.summary())   # a string: pytest prints it whole
    assert engine.certified_head.stats.rows > 0
