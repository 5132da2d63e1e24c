"""Rejection sampling is lossless, replay accepts exactly the trace, token forcing passes on the
real zoo pair (fp32) and fails a broken engine."""
import math

import pytest
import torch

from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import Pair, fresh_seed
from specpilot import settings
from specpilot.engine.replay import AcceptanceReplay, tau_pattern
from specpilot.verify.forcing import token_force
from specpilot.verify.sampling import rejection_sample, residual_probs, sample_probs


def random_probs(g, *shape):
    return torch.softmax(3 * torch.randn(*shape, generator=g), dim=-1)


def test_residual_makes_acceptance_exact():
    """Exact identity: P(first token = x) = q(x) min(1, p(x)/q(x)) + P(reject) residual(x) = p(x)."""
    g = torch.Generator().manual_seed(fresh_seed())
    for _ in range(50):
        p, q = random_probs(g, 7), random_probs(g, 7)
        accept = torch.minimum(torch.ones(7), p / q)        # P(u q < p) for u ~ U[0, 1)
        reject = 1 - (q * accept).sum()
        total = q * accept + reject * residual_probs(p, q)
        torch.testing.assert_close(total, p, rtol=0, atol=1e-6)
    p = random_probs(g, 7)
    assert torch.equal(residual_probs(p, p), p)              # nothing left: stock falls back to p


def test_rejection_sampling_is_lossless_statistically():
    """First committed token over many draws ~ target distribution (chi-square, 1e-4 false-fail rate)."""
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    vocab, k, draws = 5, 3, 12000
    p, q = random_probs(g, 1, k + 1, vocab), random_probs(g, 1, k, vocab)
    counts = torch.zeros(vocab)
    accepted_total = 0
    for _ in range(draws):
        drafts = sample_probs(q, g)                          # [1, K]
        acc, nxt = rejection_sample(drafts, p, q, g)
        first = int(drafts[0, 0]) if acc >= 1 else int(nxt)
        counts[first] += 1
        accepted_total += acc
    expected = p[0, 0] * draws
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 23.5, f"seed {seed}: chi2 {chi2:.1f} with 4 dof, counts {counts.tolist()}, p {p[0, 0].tolist()}"
    # Mean accepted drafts is exactly computable: sum_j prod_{i<=j} beta_i with beta_i = sum min(p_i, q_i).
    beta = torch.minimum(p[0, :k], q[0]).sum(-1)
    mean_acc = float(sum(torch.prod(beta[:j + 1]) for j in range(k)))
    assert abs(accepted_total / draws - mean_acc) < 5 * math.sqrt(k * k / draws), f"seed {seed}"


def test_tau_pattern_mean():
    steps = tau_pattern(4.3, 100, 16)
    assert sum(steps) == math.floor(430 + 1e-9) and set(steps) <= {4, 5}
    with pytest.raises(ValueError, match="tau=20"):
        tau_pattern(20, 3, 16)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return Pair(tmp_path_factory.mktemp("replay"), "tiny-qwen3", [0, 2], block_size=8, seed=fresh_seed())


def test_replay_accepts_exactly_the_trace(pair):
    prompt = pair.random_prompt(10)
    transcript = pair.engine.generate_ar(prompt, 40).tokens
    trace = [3, 1, 8, 2, 5]
    r = pair.engine.generate_spec(prompt, 40, replay=AcceptanceReplay(transcript, trace))
    want, produced = [], 1
    for i in range(100):                                     # the trace, cycled, capped by the tail
        if produced >= 40:
            break
        a = min(trace[i % len(trace)], 40 - produced)
        want.append(a)
        produced += a
    assert r.acceptance_lengths == want
    assert r.replay_shortfalls == 0 and r.tokens == transcript   # drafts were the target's own tokens
    r = pair.engine.generate_spec(prompt, 40, replay=AcceptanceReplay(transcript, 2.5))
    assert r.acceptance_lengths[:6] == [2, 3, 2, 3, 2, 3] and r.tokens == transcript


def test_forcing_fails_a_broken_engine(pair):
    prompts = [pair.random_prompt(8) for _ in range(2)]
    ok = token_force(pair.engine, pair.stock, prompts, 16)
    assert ok.passed and ok.reasons == [] and ok.tokens == 32, ok.reasons
    assert ok.mismatches == ok.spec_mismatches == ok.excused == 0 and ok.spec_identical == ok.ar_identical == 2
    assert ok.referee == "fp64" and 0 < ok.noise < 1e-4
    w = pair.target.norm.weight
    saved = w.clone()
    try:
        w.neg_()                      # a "faster" but wrong engine: every logit negated, any seed
        bad = token_force(pair.engine, pair.stock, prompts, 16)
    finally:
        w.copy_(saved)
    assert not bad.passed and bad.mismatches > 0 and bad.spec_mismatches > 0
    assert all(not m["excused"] and m["margin"] >= m["threshold"] for m in bad.mismatch_list)
    assert {m["path"] for m in bad.mismatch_list} == {"prefill", "decode", "verify"}
    # Every path computes far from the referee: each fails the precision check and none sets the noise.
    assert bad.noise == bad.referee_error["stock"]["rms_error"]
    assert sum("lost precision" in r for r in bad.reasons) == 3, bad.reasons
    assert all(not a["ok"] and a["ours_agree"] == 0 for a in bad.agreement.values()), bad.agreement


def test_forcing_catches_a_bug_in_the_one_token_decode_path_alone(pair, monkeypatch):
    """A bug that only one-token steps hit (as a broken AR kernel would be) passes the one-forward
    check but fails the decode path (the first choice comes from the prefill, every later one not)
    and our AR output, which forks from our speculative output at its first one-token step."""
    prompts = [pair.random_prompt(8) for _ in range(2)]
    real_forward = pair.target.forward

    def one_token_steps_broken(ids, *args, **kwargs):
        logits, features = real_forward(ids, *args, **kwargs)
        return (-logits if ids.shape[1] == 1 else logits), features

    monkeypatch.setattr(pair.target, "forward", one_token_steps_broken)
    bad = token_force(pair.engine, pair.stock, prompts, 16)
    assert not bad.passed
    assert {m["path"] for m in bad.mismatch_list} == {"decode"}
    assert all(m["position"] > 0 for m in bad.mismatch_list)
    assert len(bad.mismatch_list) == bad.tokens - 2 * 1      # every decode position after the first
    # each carries stock's own error at its position: stock is exact there (fp32 against fp64), ours not
    assert all(0 <= m["stock_local_error"] < 1e-4 < m["margin"] for m in bad.mismatch_list)
    assert bad.spec_identical == 2                            # the speculative loop runs no one-token step
    assert [(m["check"], m["position"]) for m in bad.spec_mismatch_list] == [("spec-vs-ar", 1)] * 2


def test_forcing_catches_a_bug_in_the_verify_step_alone(pair, monkeypatch):
    """A bug that only B-token steps hit (as a broken skinny GEMM would be) passes the one-forward
    and one-token paths but fails the verify path, on the positions the full block chose, and our
    speculative output, which runs those steps."""
    block = pair.engine.drafter.block_size
    prompts = [pair.random_prompt(5) for _ in range(2)]            # no prefill or full forward of B rows
    real_forward = pair.target.forward

    def block_steps_broken(ids, *args, **kwargs):
        logits, features = real_forward(ids, *args, **kwargs)
        return (-logits if ids.shape[1] == block else logits), features

    monkeypatch.setattr(pair.target, "forward", block_steps_broken)
    bad = token_force(pair.engine, pair.stock, prompts, 2 * block)
    assert not bad.passed
    assert {m["path"] for m in bad.mismatch_list} == {"verify"}
    # stock's tokens 0..B-1 go in as the first (full) block and choose tokens 1..B; the short last
    # block runs the same kernels at B - 1 rows, unbroken here
    assert {m["position"] for m in bad.mismatch_list} <= set(range(1, block + 1))
    assert bad.spec_identical == 0 and bad.spec_mismatches >= 2
    assert {m["check"] for m in bad.spec_mismatch_list} >= {"spec-vs-stock", "spec-vs-ar"}


@pytest.mark.skipif(settings.zoo_pair() is None, reason="the zoo pair (SPECPILOT_ZOO) is not present")
def test_zoo_pair_token_forces_against_stock_fp32():
    from specpilot.engine import Engine
    from specpilot.models import load_drafter, load_target, load_tokenizer
    from specpilot.models.prompts import encode_prompt, read_prompts
    from specpilot.verify.stock import load_stock

    tdir, ddir = settings.zoo_pair()
    target = load_target(tdir, dtype=torch.float32)
    engine = Engine(target, load_drafter(ddir, target), max_seq_len=1024)
    tok = load_tokenizer(tdir)
    rows = read_prompts(tdir.parent / "prompts" / "pystdlib.jsonl", limit=40)
    g = torch.Generator().manual_seed(fresh_seed())
    picks = torch.randperm(len(rows), generator=g)[:2].tolist()
    prompts = [encode_prompt(tok, rows[i])[-160:] for i in picks]     # the last 160 tokens: keeps it fast
    stop = target.eos_token_ids
    # Ours first through the CUDA-graph code path (static shapes, padded context) on the CPU ...
    from specpilot.engine.graphs import StaticShapeStep
    from specpilot.engine.steps import StepRunner

    eager_runner = engine.runner
    engine.runner = StepRunner(target, engine.drafter, engine.cache, engine.draft_cache, True, StaticShapeStep)
    static = [engine.generate_spec(p, 64, stop_ids=stop) for p in prompts]
    engine.runner = eager_runner
    # ... then stock and token forcing; the static-path outputs are the speculative outputs judged.
    report = token_force(engine, load_stock(tdir, ddir, "cpu", torch.float32), prompts, 64, stop_ids=stop,
                         spec_results=static)
    assert report.passed and report.reasons == [], report.reasons
    assert report.mismatches == report.spec_mismatches == report.excused == 0, report.summary()
    assert report.spec_identical == report.ar_identical == 2 and report.acceptance_mismatches == 0
    assert report.referee == "fp64" and report.noise < 1e-4
    eager = engine.generate_spec(prompts[0], 64, stop_ids=stop)
    assert eager.tokens == static[0].tokens and eager.acceptance_lengths == static[0].acceptance_lengths


def test_referee_error_of_an_exact_engine_is_rounding_only(pair):
    """The unbroken fp32 engine against the fp64 referee: every path agrees with the referee's argmax
    at every position, within fp32 rounding; the noise is the largest of those errors."""
    report = token_force(pair.engine, pair.stock, [pair.random_prompt(8)], 12)
    assert report.passed and report.tokens > 0
    error = report.referee_error
    assert list(error) == ["stock", "prefill", "decode", "verify"]
    for side, e in error.items():
        assert e["positions"] == report.tokens and e["same_argmax"] == report.tokens, (side, e)
        assert e["rms_error"] < 1e-4, (side, e)
    assert report.noise == max(e["rms_error"] for e in error.values())
    assert all(a["ok"] and a["ours_agree"] == a["stock_agree"] == report.tokens for a in report.agreement.values())


def test_ulp_fallback_without_a_referee_says_so_and_still_judges(pair):
    from specpilot.verify.referee import no_referee

    prompts = [pair.random_prompt(8)]
    ok = token_force(pair.engine, pair.stock, prompts, 12, referee=no_referee("test: no referee"))
    assert ok.passed and ok.referee == "none" and ok.noise is None and ok.agreement == {}
    assert "ulp fallback" in ok.rule and ok.referee_note == "test: no referee"
    w = pair.target.norm.weight
    saved = w.clone()
    try:
        w.neg_()
        bad = token_force(pair.engine, pair.stock, prompts, 12, referee=no_referee("test"))
    finally:
        w.copy_(saved)
    assert not bad.passed and bad.mismatches > 0 and bad.spec_mismatches > 0


def test_arbiter_error_tally_by_hand():
    from specpilot.verify.arbiter_error import ArbiterErrorTally

    tally = ArbiterErrorTally()
    reference = torch.tensor([[0.0, 1.0, 2.0], [3.0, 0.0, 0.0]])
    tally.add("ours", reference + torch.tensor([[0.0, 0.0, 3.0], [0.0, 4.0, 0.0]]), reference)
    tally.add("ours", torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[1.0, 0.0, 0.0]]))
    e = tally.summary()["ours"]
    # squared errors 9 + 16 (first add) + 1 + 1 (second) over 9 values; argmax kept on row 1 only
    assert e == {"rms_error": pytest.approx((27 / 9) ** 0.5), "same_argmax": 1, "positions": 3}
    with pytest.raises(ValueError, match="ours: logits"):
        tally.add("ours", torch.zeros(2, 3), torch.zeros(2, 4))
