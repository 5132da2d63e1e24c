"""DSpark in our engine against a plain torch loop that follows DeepSpec's evaluator
(verify/dspark_reference.py) and against the target's greedy AR output, on tiny random pairs, CPU
fp32: identical tokens and acceptance lengths at several block sizes; the confidence head is
computed but never changes a token; misfit drafters refused."""
import json

import pytest
import torch

from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from drafter_helpers import KindPair, accepting_pair
from specpilot.verify.dspark_reference import DSparkReference
from specpilot.verify.pard_reference import load_hf
from specpilot.models import load_drafter, load_target


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    p = accepting_pair(lambda: tmp_path_factory.mktemp("dspark"), "dspark", block_size=8)
    p.reference, p.hf_target = DSparkReference(p.drafter_dir), load_hf(p.target_dir)
    return p


@pytest.fixture(scope="module")
def plain_pair(tmp_path_factory):
    p = KindPair(tmp_path_factory.mktemp("dspark_plain"), "dspark", seed=4, block_size=8, preset="tiny-llama")
    p.reference, p.hf_target = DSparkReference(p.drafter_dir), load_hf(p.target_dir)
    return p


def test_greedy_equals_reference_and_ar(pair):
    assert pair.drafter.kind == "dspark" and pair.drafter.block_size == 8 and pair.drafter.config.block_size == 7
    longest = 0
    for block_size in (2, 3, 5, 8):
        for prompt in pair.prompts(block_size, 5 + block_size):
            for max_new in (1, 9, 23):
                ref_tokens, ref_acc = pair.reference.generate(pair.hf_target, prompt, max_new, block_size)
                ours = pair.engine.generate_spec(prompt, max_new, block_size=block_size)
                assert ours.tokens == ref_tokens, f"seed {pair.seed}, block {block_size}, max_new {max_new}"
                assert ours.acceptance_lengths == ref_acc
                assert ours.tokens == pair.engine.generate_ar(prompt, max_new).tokens
                longest = max([longest, *ours.acceptance_lengths])
    assert longest > 2


def test_varied_output(plain_pair):
    seen = set()
    for _ in range(3):
        prompt = plain_pair.prompt(10)
        ref_tokens, ref_acc = plain_pair.reference.generate(plain_pair.hf_target, prompt, 30, 8)
        ours = plain_pair.engine.generate_spec(prompt, 30)
        assert ours.tokens == ref_tokens == plain_pair.engine.generate_ar(prompt, 30).tokens
        assert ours.acceptance_lengths == ref_acc
        seen |= set(ours.tokens)
    assert len(seen) > 5, "degenerate outputs: the check would see little"


def test_stop_token(pair):
    prompt = pair.prompt(8)
    free = pair.engine.generate_ar(prompt, 20).tokens
    stop = free[5]
    ref_tokens, ref_acc = pair.reference.generate(pair.hf_target, prompt, 20, 8, (stop,))
    ours = pair.engine.generate_spec(prompt, 20, stop_ids=(stop,))
    assert ours.tokens == ref_tokens == free[:free.index(stop) + 1] and ours.acceptance_lengths == ref_acc


def test_confidence_is_for_scheduling_only(pair):
    """The confidence head yields one probability per draft, and zeroing it changes no token."""
    from specpilot.models.drafters.dspark import DSparkSession

    seen = []
    propose = DSparkSession.propose

    def spy(self, *args):
        out = propose(self, *args)
        seen.append(self.confidence)
        return out

    prompt = pair.prompt(9)
    DSparkSession.propose = spy
    try:
        before = pair.engine.generate_spec(prompt, 16)
    finally:
        DSparkSession.propose = propose
    assert len(seen) == before.steps and all(c.shape[0] == 1 and 1 <= c.shape[1] <= 7 and ((c > 0) & (c < 1)).all()
                                             for c in seen)
    assert seen[0].shape[1] == 7
    saved = pair.drafter.confidence.weight.clone()
    with torch.no_grad():
        pair.drafter.confidence.weight.zero_()
    try:
        after = pair.engine.generate_spec(prompt, 16)
    finally:
        with torch.no_grad():
            pair.drafter.confidence.weight.copy_(saved)
    assert after.tokens == before.tokens and after.acceptance_lengths == before.acceptance_lengths


def test_sampling_reproducible(pair):
    prompt = pair.prompt(9)
    a = pair.engine.generate_spec(prompt, 20, temperature=0.8, seed=3)
    b = pair.engine.generate_spec(prompt, 20, temperature=0.8, seed=3)
    assert a.tokens == b.tokens and a.acceptance_lengths == b.acceptance_lengths and len(a.tokens) == 20


def test_misfit_drafter_refused(tmp_path):
    pair = KindPair(tmp_path, "dspark", seed=2)
    target = load_target(pair.target_dir, dtype=torch.float32)
    ddir = pair.drafter_dir
    cfg = json.loads((ddir / "config.json").read_text())
    for change, message in ((lambda c: c.update(target_layer_ids=[0, 7]), "outside the target"),
                            (lambda c: c.update(vocab_size=300), "vocab_size 300 != target"),
                            (lambda c: c.update(markov_head_type="rnn"), "vanilla only"),
                            (lambda c: c.pop("block_size"), "no 'block_size'")):
        bad = dict(cfg)
        change(bad)
        (ddir / "config.json").write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=message):
            load_drafter(ddir, target)
