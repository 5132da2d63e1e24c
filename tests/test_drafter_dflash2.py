"""DFlash2 in our engine against stock dflash 0.1.0 (`dflash_generate` with `DFlash2DraftModel`) on
tiny random pairs, CPU fp32: identical tokens and acceptance lengths, greedy at several block sizes
and sampled (same draws); rejection sampling over the selector's sparse distribution checked
statistically."""
import pytest
import torch

from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from drafter_helpers import accepting_pair
from test_engine_helpers import fresh_seed
from specpilot.models import load_drafter, load_target
from specpilot.models.drafters.dflash2 import dense_draft_probs
from specpilot.models.drafters.random_kinds import write_kind_pair
from specpilot.verify.sampling import rejection_sample
from specpilot.verify.stock import load_stock, run_stock

LAYOUTS = {"full": {}, "sliding": {"layer_types": ("full_attention", "sliding_attention"), "sliding_window": 5}}


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def pair(request, tmp_path_factory):
    p = accepting_pair(lambda: tmp_path_factory.mktemp(f"dflash2_{request.param}"), "dflash2", **LAYOUTS[request.param])
    p.stock = load_stock(p.target_dir, p.drafter_dir, "cpu", torch.float32)
    return p


def test_loads_as_dflash2(pair):
    assert pair.drafter.kind == "dflash2" and type(pair.stock.drafter).__name__ == "DFlash2DraftModel"


def test_greedy_equals_stock_and_ar(pair):
    longest = 0
    for block_size in (2, 3, 5, 8):
        for prompt in pair.prompts(block_size, 6 + block_size):
            for max_new in (1, 9, 23):
                ref = run_stock(pair.stock, prompt, max_new, (), 0.0, block_size)
                ours = pair.engine.generate_spec(prompt, max_new, block_size=block_size)
                assert ours.tokens == ref.tokens, f"seed {pair.seed}, block {block_size}, max_new {max_new}"
                assert ours.acceptance_lengths == ref.acceptance_lengths
                assert ours.tokens == pair.engine.generate_ar(prompt, max_new).tokens
                longest = max([longest, *ours.acceptance_lengths])
    assert longest > 2, "no step accepted two drafts: the test would not see an acceptance bug"


def test_stop_token(pair):
    prompt = pair.prompt(9)
    free = pair.engine.generate_ar(prompt, 20).tokens
    stop = free[6]
    ref = run_stock(pair.stock, prompt, 20, (stop,), 0.0, 8)
    ours = pair.engine.generate_spec(prompt, 20, stop_ids=(stop,))
    assert ours.tokens == ref.tokens == free[:free.index(stop) + 1]
    assert ours.acceptance_lengths == ref.acceptance_lengths


def test_sampling_equals_stock(pair):
    """T > 0: the selector's per-position draws, then rejection sampling over its sparse q, draw for
    draw as stock after torch.manual_seed(seed)."""
    prompt = pair.prompt(9)
    for temperature in (0.6, 1.0):
        seed = fresh_seed()
        ours = pair.engine.generate_spec(prompt, 24, temperature=temperature, seed=seed)
        ref = run_stock(pair.stock, prompt, 24, (), temperature, None, seed=seed)
        assert ours.tokens == ref.tokens and ours.acceptance_lengths == ref.acceptance_lengths, f"seed {seed}"


def _chi2_pvalue(counts, probs):
    from scipy.stats import chisquare

    n = counts.sum()
    keep = probs > 0
    return chisquare(counts[keep], probs[keep] * n / probs[keep].sum()).pvalue


def test_rejection_over_sparse_selector_distribution_is_lossless():
    """The committed first token of a step is distributed as the target's p whatever the selector's
    sparse q (top-k candidates): chi-square over 40000 draws; the same check rejects a broken rule
    (resampling from p after a rejection instead of the residual), so it can fail."""
    g = torch.Generator().manual_seed(fresh_seed())
    vocab, k, n = 8, 3, 40000
    p = torch.softmax(torch.randn(1, 2, vocab, generator=g) * 1.5, dim=-1)           # target, 1 draft + bonus
    candidates = torch.randperm(vocab, generator=g)[:k].view(1, 1, k)
    q_sparse = torch.softmax(torch.randn(1, 1, k, generator=g) * 2, dim=-1)
    q = dense_draft_probs(candidates, q_sparse, vocab)
    good, broken = torch.zeros(vocab), torch.zeros(vocab)
    drafts = torch.multinomial(q[0, 0], n, replacement=True, generator=g)
    for i in range(n):
        d = drafts[i].view(1, 1)
        accepted, token = rejection_sample(d, p, q, g)
        first = int(d[0, 0]) if accepted else int(token)
        good[first] += 1
        if accepted:
            broken[int(d[0, 0])] += 1
        else:
            broken[int(torch.multinomial(p[0, 0], 1, generator=g))] += 1
    assert _chi2_pvalue(good.numpy(), p[0, 0].numpy()) > 1e-4
    assert _chi2_pvalue(broken.numpy(), p[0, 0].numpy()) < 1e-6


def test_misfit_drafter_refused(tmp_path):
    import json

    tdir, ddir = write_kind_pair(tmp_path, "dflash2", "tiny-qwen3", layer_ids=[0, 2], seed=1)
    target = load_target(tdir, dtype=torch.float32)
    cfg = json.loads((ddir / "config.json").read_text())
    for change, message in ((lambda c: c["dflash_config"].update(target_layer_ids=[0, 9]), "outside the target"),
                            (lambda c: c.update(hidden_size=32), "hidden_size 32 != target"),
                            (lambda c: c["dflash_config"].pop("selector_rank"), "lacks"),
                            (lambda c: c.update(layer_types=["full_attention"]), "layer_types")):
        bad = json.loads(json.dumps(cfg))
        change(bad)
        (ddir / "config.json").write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=message):
            load_drafter(ddir, target)
