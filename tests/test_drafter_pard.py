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
        hf = plain_pair.hf_target.generate(torch.tensor([prompt]), max_new_tokens=30, do_sample=False,
                                           pad_token_id=0)[0, len(prompt):].tolist()
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
                            (lambda c: c.update(spd_type="pard2"), "PARD-2 drafter")):
        bad = dict(cfg)
        change(bad)
        (ddir / "config.json").write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=message):
            load_drafter(ddir, target)
