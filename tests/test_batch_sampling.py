"""Sampled decoding in the batched engine is lossless: over many requests (each its own seed), the
first three new tokens are distributed as the target's own sampling distribution (chi-square over
the joint, small vocab), with adaptive verify trimming blocks and rejection sampling per request."""
import math

import pytest
import torch

from batch_helpers import random_prompts, tiny_pair
from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import fresh_seed
from specpilot.engine import Engine
from specpilot.engine.batch import BatchConfig, BatchEngine, Request
from specpilot.verify.sampling import sampling_probs

VOCAB, NEW, DRAWS = 6, 3, 3000
# 64 requests at a time, a budget flat up to 96 verify rows: about half the drafts get verified.
PARTLY_TRIMMED = BatchConfig(adaptive_verify=True, cost_ridge_tokens=96)


def chi2_threshold(dof: int, z: float = 3.719) -> float:
    """Upper 1e-4 quantile of chi-square(dof) (Wilson-Hilferty; z = the normal's 1e-4 quantile)."""
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def joint_probs(target, prompt, temperature, top_p) -> dict:
    """(t1, t2, t3) -> the target's probability of sampling it after `prompt`."""
    engine = Engine(target, None, max_seq_len=len(prompt) + NEW + 4)

    def next_probs(ids):
        logits, _ = engine.runner.prefill(torch.tensor([ids]), with_features=False)
        return sampling_probs(logits[0, -1], temperature, top_p).double()

    out = {}
    with torch.inference_mode():
        p1 = next_probs(prompt)
        for a in range(VOCAB):
            p2 = next_probs(prompt + [a])
            for b in range(VOCAB):
                p3 = next_probs(prompt + [a, b])
                for c in range(VOCAB):
                    out[(a, b, c)] = float(p1[a] * p2[b] * p3[c])
    return out


def chi2(counts: dict, expected: dict, draws: int) -> tuple:
    """Chi-square statistic and dof, cells with expected count < 5 pooled into one."""
    stat, pooled_obs, pooled_exp, cells = 0.0, 0, 0.0, 0
    for cell, p in expected.items():
        e, o = p * draws, counts.get(cell, 0)
        if e < 5:
            pooled_obs, pooled_exp = pooled_obs + o, pooled_exp + e
        else:
            stat, cells = stat + (o - e) ** 2 / e, cells + 1
    if pooled_exp > 0:
        stat, cells = stat + (pooled_obs - pooled_exp) ** 2 / max(pooled_exp, 1e-12), cells + 1
    return stat, cells - 1


def run_draws(seed, temperature, top_p):
    """DRAWS requests of one prompt through the batched engine; (target, prompt, results, engine)."""
    target, drafter = tiny_pair(VOCAB, 4, seed)
    prompt = random_prompts(VOCAB, (5,), seed)[0]
    engine = BatchEngine(target, drafter, PARTLY_TRIMMED, max_batch=64, kv_pages=64)
    for i in range(DRAWS):
        engine.submit(Request(tuple(prompt), NEW, temperature=temperature, top_p=top_p, seed=seed * 7919 + i))
    results = engine.run_until_done()
    assert all(r.error is None and len(r.tokens) == NEW for r in results)
    return target, prompt, results, engine


def exercising_draws(run) -> tuple:
    """(seed, target, prompt, counts of each output) of run(seed) -> (target, prompt, results, engine)
    for the first of 5 seeds whose draws run rejection sampling and the budget's trimming often: a random
    pair that rarely accepts a draft is replaced by the next seed's (chosen on acceptance alone, before
    any distribution check)."""
    for seed in range(fresh_seed(), 2**31)[:5]:
        target, prompt, results, engine = run(seed)
        multi = sum(a > 1 for r in results for a in r.acceptance_lengths)
        if multi > DRAWS // 10 and engine.block_rows - engine.verify_rows > DRAWS // 20:
            break
    else:
        pytest.fail(f"5 pairs from seed {seed - 4}: rejection sampling or the budget's trimming barely ran")
    counts = {}
    for r in results:
        counts[tuple(r.tokens)] = counts.get(tuple(r.tokens), 0) + 1
    return seed, target, prompt, counts


@pytest.mark.parametrize("temperature, top_p", [(1.5, 1.0), (1.0, 0.8)])
def test_sampled_output_distribution_is_the_targets(temperature, top_p):
    seed, target, prompt, counts = exercising_draws(lambda s: run_draws(s, temperature, top_p))
    stat, dof = chi2(counts, joint_probs(target, prompt, temperature, top_p), DRAWS)
    assert stat < chi2_threshold(dof), f"seed {seed}: chi2 {stat:.1f} with {dof} dof"
    # The test has power: the same draws against a neighbouring distribution (another temperature) fail.
    wrong, wrong_dof = chi2(counts, joint_probs(target, prompt, temperature * 0.6, top_p), DRAWS)
    assert wrong > chi2_threshold(wrong_dof), f"seed {seed}: chi2 cannot tell T={temperature} from {temperature * 0.6}"
