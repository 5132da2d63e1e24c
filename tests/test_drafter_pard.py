"""PARD in our engine against a plain HF loop (verify/pard_reference.py) and the target's greedy AR
output, on tiny random pairs, CPU fp32: identical tokens and acceptance lengths at several block
sizes; sampling reproducible; misfit drafters refused."""
import json

import pytest
import torch

from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from drafter_helpers import KindPair, accepting_pair
from specpilot.verify.pard_reference import load_hf, pard_generate
from specpilot.models import load_drafter, load_target

SHAPES = {"small": {}, "target-copy": {"pard_shape": "target"}}


@pytest.fixture(scope="module", params=sorted(SHAPES))
def pair(request, tmp_path_factory):
    p = accepting_pair(lambda: tmp_path_factory.mktemp(f"pard_{request.param}"), "pard", block_size=13,
                       **SHAPES[request.param])
    p.hf_target, p.hf_drafter = load_hf(p.target_dir), load_hf(p.drafter_dir)
    return p


@pytest.fixture(scope="module")
def plain_pair(tmp_path_factory):
    """No two-token head: varied outputs (drafts rarely accepted)."""
    p = KindPair(tmp_path_factory.mktemp("pard_plain"), "pard", seed=7, block_size=6, preset="tiny-llama")
    p.hf_target, p.hf_drafter = load_hf(p.target_dir), load_hf(p.drafter_dir)
    return p


def test_greedy_equals_reference_and_ar(pair):
    assert pair.drafter.kind == "pard" and pair.drafter.block_size == 13
    longest = 0
    for block_size in (2, 3, 6, 13):
        for prompt in pair.prompts(block_size, 5 + block_size):
            for max_new in (1, 9, 23):
                ref_tokens, ref_acc = pard_generate(pair.hf_target, pair.hf_drafter, prompt, max_new, block_size,
                                                    pair.drafter.mask_token_id)
                ours = pair.engine.generate_spec(prompt, max_new, block_size=block_size)
                assert ours.tokens == ref_tokens, f"seed {pair.seed}, block {block_size}, max_new {max_new}"
                assert ours.acceptance_lengths == ref_acc
                assert ours.tokens == pair.engine.generate_ar(prompt, max_new).tokens
                longest = max([longest, *ours.acceptance_lengths])
    assert longest > 2


def test_varied_output_equals_hf_greedy(plain_pair):
    seen = set()
    for _ in range(3):
        prompt = plain_pair.prompt(11)
        ids = torch.tensor([prompt])          # an explicit mask: HF would take pad-id tokens for padding
        hf = plain_pair.hf_target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=30,
                                           do_sample=False, eos_token_id=None,   # ours runs on past eos
                                           pad_token_id=318)[0, len(prompt):].tolist()
        ours = plain_pair.engine.generate_spec(prompt, 30)
        ref_tokens, ref_acc = pard_generate(plain_pair.hf_target, plain_pair.hf_drafter, prompt, 30, 6,
                                            plain_pair.drafter.mask_token_id)
        assert ours.tokens == hf == ref_tokens and ours.acceptance_lengths == ref_acc
        seen |= set(hf)
    assert len(seen) > 5, "degenerate outputs: the check would see little"


def test_stop_token(pair):
    prompt = pair.prompt(8)
    free = pair.engine.generate_ar(prompt, 20).tokens
    stop = free[4]
    ref_tokens, ref_acc = pard_generate(pair.hf_target, pair.hf_drafter, prompt, 20, 13, pair.drafter.mask_token_id,
                                        (stop,))
    ours = pair.engine.generate_spec(prompt, 20, stop_ids=(stop,))
    assert ours.tokens == ref_tokens == free[:free.index(stop) + 1] and ours.acceptance_lengths == ref_acc


def test_sampling_reproducible(pair):
    prompt = pair.prompt(9)
    a = pair.engine.generate_spec(prompt, 20, temperature=0.8, seed=5)
    b = pair.engine.generate_spec(prompt, 20, temperature=0.8, seed=5)
    assert a.tokens == b.tokens and a.acceptance_lengths == b.acceptance_lengths and len(a.tokens) == 20


def test_misfit_drafter_refused(tmp_path):
    tdir, ddir = KindPair(tmp_path, "pard", seed=2).target_dir, None
    target = load_target(tdir, dtype=torch.float32)
    ddir = tmp_path / "drafter"
    cfg = json.loads((ddir / "config.json").read_text())
    for change, message in ((lambda c: c.update(vocab_size=300), "vocab_size 300 != target"),
                            (lambda c: c.update(pard_token=5000), "pard_token 5000"),
                            (lambda c: c.update(pard_draft_k=0), "pard_draft_k 0"),
                            (lambda c: c.update(spd_type="pard2"), "needs pard2_target_layers"),
                            (lambda c: c.update(spd_type="pard2", pard2_target_layers=[0]), "0, the embeddings"),
                            (lambda c: c.update(spd_type="pard2", pard2_target_layers=[1], pard2_target_dim=7),
                             "pard2_target_dim 7")):
        bad = dict(cfg)
        change(bad)
        (ddir / "config.json").write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=message):
            load_drafter(ddir, target)
    bad = dict(cfg, spd_type="pard2", pard2_target_layers=[1], pard2_target_dim=target.config.hidden_size)
    (ddir / "config.json").write_text(json.dumps(bad))
    with pytest.raises(FileNotFoundError, match="warp_model.bin"):
        load_drafter(ddir, target)


@pytest.fixture(scope="module")
def pard2_pair(tmp_path_factory):
    """PARD-2: target features of layers 1 and 3 (HF hidden_states indices) fused into the drafter's
    input embeddings; scale 1 so that a wrong feature row changes the drafts."""
    from specpilot.verify.pard_reference import PardReference

    p = accepting_pair(lambda: tmp_path_factory.mktemp("pard2"), "pard", block_size=9, pard2_layers=[1, 3],
                       pard2_scale=1.0)
    p.hf_target, p.reference = load_hf(p.target_dir), PardReference(p.drafter_dir)
    return p


def test_pard2_equals_reference_and_ar(pard2_pair):
    pair = pard2_pair
    assert pair.drafter.config.pard2 and pair.engine.runner.feature_layers == (0, 2)
    assert pair.reference.warp is not None
    longest = 0
    for block_size in (2, 4, 9):
        for prompt in pair.prompts(block_size, 6 + block_size):
            for max_new in (1, 9, 23):
                ref_tokens, ref_acc = pair.reference.generate(pair.hf_target, prompt, max_new, block_size)
                ours = pair.engine.generate_spec(prompt, max_new, block_size=block_size)
                assert ours.tokens == ref_tokens, f"seed {pair.seed}, block {block_size}, max_new {max_new}"
                assert ours.acceptance_lengths == ref_acc
                assert ours.tokens == pair.engine.generate_ar(prompt, max_new).tokens
                longest = max([longest, *ours.acceptance_lengths])
    assert longest > 2


def test_pard2_logits_depend_on_feature_alignment(pard2_pair):
    """The drafter's logits move when its feature rows shift by one position, so the equality above
    checks which target row feeds which token (scale 1 here; the published default is 0.02)."""
    from specpilot.engine.cache import drafter_cache

    d = pard2_pair.drafter
    ids = torch.tensor([pard2_pair.prompt(10)])
    features = torch.randn(1, 10, d.config.feature_dim, generator=torch.Generator().manual_seed(0))
    cache = drafter_cache(d, 1, 64)
    with torch.inference_mode():
        aligned = d.forward_tokens(ids, 0, cache, features=features)
        shifted = d.forward_tokens(ids, 0, cache, features=features.roll(1, dims=1))
        plain = d.forward_tokens(ids, 0, cache)
    assert (aligned - shifted).abs().max() > 1e-2 and (aligned - plain).abs().max() > 1e-2
