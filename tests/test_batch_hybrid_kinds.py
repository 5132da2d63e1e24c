"""DFlash2, DSpark and PARD drafters on a hybrid recurrent target (tiny Qwen3.5 layout, fp32, CPU), in
the batched engine: every request's tokens and acceptance lengths equal the single-request engine's,
whose tokens equal the target's own greedy AR (the drafters' heads peaked on two tokens, so steps
accept several drafts and the recurrent state is committed after multi-token prefixes)."""
import itertools

import pytest

from batch_helpers import CONFIGS, random_prompts, run_staggered
from drafter_helpers import accepting_pair
from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from specpilot.engine import Engine
from specpilot.engine.batch import BatchEngine, Request

PROMPT_VOCAB = 318


def requests_for(seed):
    prompts = random_prompts(PROMPT_VOCAB, (3, 21, 9, 70), seed)       # 70: a prompt past the per-row state form
    return [Request(tuple(p), m) for p, m in zip(prompts, (17, 5, 23, 9))]


def single(pair, req):
    engine = Engine(pair.target, pair.drafter, max_seq_len=len(req.prompt_ids) + req.max_new_tokens + 8)
    return engine.generate_spec(req.prompt_ids, req.max_new_tokens)


def accepts_on_the_requests(pair) -> bool:
    return max(a for req in requests_for(pair.seed) for a in single(pair, req).acceptance_lengths) > 2


@pytest.fixture(scope="module", params=["dflash2", "dspark", "pard"])
def pair(request, tmp_path_factory):
    count = itertools.count()
    return accepting_pair(lambda: tmp_path_factory.mktemp(f"hybrid_{request.param}{next(count)}"), request.param,
                          preset="tiny-qwen3.5", accepts=accepts_on_the_requests, block_size=5)


@pytest.mark.parametrize("name", ["all-on", "all-off"])
def test_kind_on_a_hybrid_equals_single_request(pair, name):
    assert pair.target.is_hybrid and pair.drafter.kind == pair.kind
    requests = requests_for(pair.seed)
    ar = Engine(pair.target, None, max_seq_len=128)
    engine = BatchEngine(pair.target, pair.drafter, CONFIGS[name], max_batch=3, kv_pages=64)
    results = run_staggered(engine, requests)
    for i, req in enumerate(requests):
        ref = single(pair, req)
        assert ref.tokens == ar.generate_ar(req.prompt_ids, req.max_new_tokens).tokens, f"seed {pair.seed}, request {i}"
        assert results[i].error is None and results[i].tokens == ref.tokens, f"seed {pair.seed}, request {i}"
        if engine.verify_rows == engine.block_rows:
            assert results[i].acceptance_lengths == ref.acceptance_lengths, f"seed {pair.seed}, request {i}"
    assert engine.pool.free_pages == 64 and engine.recurrent.free_slots == 3 and not engine.recurrent.pending
