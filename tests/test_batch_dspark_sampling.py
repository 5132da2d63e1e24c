"""Sampled DSpark drafting in the batched engine is lossless at top_p < 1 too, where no single-request
run compares (the single-request engine has no top_p): the DSpark drafts are draws of
softmax(logits / T) without top_p (as DSparkDrafter.draft), the accept uses the target's top_p
distribution, and over many requests (each its own seed) the first three tokens are distributed as the
target's own (chi-square over the joint, vocab 6), with adaptive verify trimming blocks."""
from dataclasses import replace

import torch

from batch_helpers import random_prompts
from test_batch_sampling import DRAWS, NEW, PARTLY_TRIMMED, VOCAB, chi2, chi2_threshold, exercising_draws, joint_probs
from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from specpilot.engine.batch import BatchEngine, Request
from specpilot.models import load_drafter, load_target
from specpilot.models.drafters.random_kinds import write_kind_pair
from specpilot.models.random_ckpt import TARGET_PRESETS


def run_draws(folder, seed, temperature, top_p):
    cfg = replace(TARGET_PRESETS["tiny-llama"], vocab_size=VOCAB)
    t, d = write_kind_pair(folder, "dspark", cfg, drafter_layers=2, block_size=4, seed=seed, layer_ids=[0, 2])
    target = load_target(t, dtype=torch.float32)
    drafter = load_drafter(d, target)
    prompt = random_prompts(VOCAB, (5,), seed)[0]
    engine = BatchEngine(target, drafter, PARTLY_TRIMMED, max_batch=64, kv_pages=64)
    for i in range(DRAWS):
        engine.submit(Request(tuple(prompt), NEW, temperature=temperature, top_p=top_p, seed=seed * 7919 + i))
    results = engine.run_until_done()
    assert all(r.error is None and len(r.tokens) == NEW for r in results)
    return target, prompt, results, engine


def test_sampled_top_p_output_distribution_is_the_targets(tmp_path_factory):
    temperature, top_p = 1.0, 0.8
    seed, target, prompt, counts = exercising_draws(
        lambda s: run_draws(tmp_path_factory.mktemp("dspark_draws"), s, temperature, top_p))
    stat, dof = chi2(counts, joint_probs(target, prompt, temperature, top_p), DRAWS)
    assert stat < chi2_threshold(dof), f"seed {seed}: chi2 {stat:.1f} with {dof} dof"
    # The test has power: the same draws against the distribution without top_p fail.
    wrong, wrong_dof = chi2(counts, joint_probs(target, prompt, temperature, 1.0), DRAWS)
    assert wrong > chi2_threshold(wrong_dof), f"seed {seed}: chi2 cannot tell top_p={top_p} from 1"
