"""Certified coarse-to-fine LM head (EngineConfig.two_level = "certified-head", engine/certified_head.py):
a certified row's winner is the exact LM head's argmax; the engine's outputs are the single-level
engine's; a planted too-tight bound certifies wrong tokens and `specpilot verify` FAILs it. CPU."""
import json

import pytest
import torch

from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import Pair, fresh_seed
from device_watch import tensors_stay_on
from specpilot.cli import main
from specpilot.config import EngineConfig
from specpilot.engine import Engine
from specpilot.engine import certified_head
from specpilot.engine.certified_head import CertifiedHead, HeadBounds, certify
from specpilot.models.drafter import DFlashDrafter


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rank", [0, 8, 64])
def test_a_certified_winner_is_the_exact_heads_argmax(dtype, rank):
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    v, h, t = 500, 64, 256
    w = (torch.randn(v, h, generator=g) * 0.1).to(dtype)
    # rows pointing at a token (clear winners) and plain noise (near ties): both kinds must be right
    picks = torch.randint(0, v, (t,), generator=g)
    scale = torch.rand(t, 1, generator=g) * 60
    x = (w[picks].float() * scale + torch.randn(t, h, generator=g)).to(dtype)
    exact = torch.nn.functional.linear(x, w)                         # the single-level head, the model dtype
    shortlist = torch.cat([picks[:, None], torch.randint(0, v, (t, 7), generator=g)], dim=1)
    winner, certified = certify(x, shortlist, HeadBounds.build(w, rank), dtype)
    assert torch.equal(winner[certified], exact.argmax(-1)[certified]), f"seed {seed}"
    if rank == h:
        assert certified.any()


def test_full_rank_certifies_a_clear_winner_and_norm_bounds_do_not():
    """Non-vacuous: with the exact subspace (rank H) a clear winner in the shortlist is certified; the
    Cauchy-Schwarz bound (rank 0) is too loose for the same row."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(300, 32, generator=g) * 0.1
    x = (w[7] * 200 + torch.randn(32, generator=g))[None]
    shortlist = torch.tensor([[7, 1, 2]])
    assert certify(x, shortlist, HeadBounds.build(w, 32), torch.float32)[1].item()
    assert not certify(x, shortlist, HeadBounds.build(w, 0), torch.float32)[1].item()


def test_bad_rank_and_sampling_are_refused(tmp_path):
    with pytest.raises(ValueError, match="rank 99 must be in 0..4"):
        HeadBounds.build(torch.zeros(5, 4), 99)
    pair = Pair(tmp_path, "tiny-qwen3", [0, 2], block_size=4, seed=fresh_seed())
    engine = Engine(pair.target, pair.drafter, max_seq_len=64, config=EngineConfig(two_level="certified-head"))
    with pytest.raises(ValueError, match="greedy argmax only"):
        engine.generate_spec([1, 2, 3], 4, temperature=0.7)



def test_the_device_watch_catches_a_tensor_built_without_a_device():
    w = torch.randn(4, 3)
    with pytest.raises(AssertionError, match="eye -> meta"):
        with tensors_stay_on("cpu"):
            w @ torch.eye(3)


@pytest.mark.parametrize("rank", [0, 8])
def test_bounds_and_certify_build_every_tensor_on_the_weights_device(rank):
    """The GPU bug class seen on the device (a CPU-built identity against a CUDA basis), caught on the
    CPU: nothing in the construction or the per-step certificate relies on the default device."""
    g = torch.Generator().manual_seed(fresh_seed())
    w = torch.randn(200, 16, generator=g).to(torch.bfloat16)
    x = (w[:4].float() * 30).to(torch.bfloat16)
    shortlist = torch.arange(12).view(4, 3)
    with tensors_stay_on("cpu"):
        bounds = HeadBounds.build(w, rank)
        winner, certified = certify(x, shortlist, bounds, torch.bfloat16)
    assert winner.shape == certified.shape == (4,)

@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return Pair(tmp_path_factory.mktemp("certified"), "tiny-llama", [1, 2], block_size=8, seed=fresh_seed())


def oracle_drafter(monkeypatch, sequence):
    """Drafts = the honest greedy transcript (so shortlists hold the target's argmax and rows certify)."""
    real = DFlashDrafter.forward_block

    def oracle(self, block_ids, positions, cache, kv_len, last_visible=None):
        logits = real(self, block_ids, positions, cache, kv_len, last_visible)
        for i, p in enumerate(positions.reshape(-1)[1:].tolist()):
            if p < len(sequence):
                logits[0, i, sequence[p]] = logits[0, i].max() + 1
        return logits

    monkeypatch.setattr(DFlashDrafter, "forward_block", oracle)


def test_engine_outputs_equal_single_level_with_rows_certified(pair, monkeypatch):
    prompt = pair.random_prompt(9)
    ar = pair.engine.generate_ar(prompt, 40, stop_ids=())
    oracle_drafter(monkeypatch, prompt + ar.tokens[:30])                # the last drafts are the drafter's own
    single = pair.engine.generate_spec(prompt, 40, stop_ids=())
    engine = Engine(pair.target, pair.drafter, max_seq_len=256, config=EngineConfig(two_level="certified-head"))
    engine.certified_head = CertifiedHead(pair.target, rank=pair.target.config.hidden_size)
    mine = engine.generate_spec(prompt, 40, stop_ids=())
    assert mine.tokens == single.tokens == ar.tokens
    assert mine.acceptance_lengths == single.acceptance_lengths
    stats = engine.certified_head.stats
    assert 0 < stats.certified_rows < stats.rows, stats.summary()     # both levels ran



def test_the_engines_certified_head_keeps_every_tensor_on_the_models_device(pair):
    """Construction and one bound verify step (both levels) under the device watch."""
    g = torch.Generator().manual_seed(fresh_seed())
    hidden_size, vocab = pair.target.config.hidden_size, pair.target.config.vocab_size
    block = torch.randint(0, vocab, (1, 4), generator=g)
    draft_logits = torch.randn(1, 3, vocab, generator=g)
    hidden = torch.randn(1, 4, hidden_size, generator=g).to(pair.target.dtype)
    with tensors_stay_on("cpu"), torch.inference_mode():
        head = CertifiedHead(pair.target, rank=8)
        logits = head.bind(block, draft_logits)(hidden)
    assert logits.shape == (1, 4, vocab) and head.stats.rows == 4

REAL_BUILD = HeadBounds.build


def test_a_step_needs_the_exact_head_only_for_an_uncertified_needed_row(pair):
    """Needed rows: up to the first row that is not a certified match of the next draft (the bonus
    row); rows after it cannot change the output, so their certificates do not count."""
    head = CertifiedHead(pair.target, rank=0)
    block = torch.tensor([5, 7, 9, 11])
    cases = [([7, 2, 0, 0], [True, True, False, False], True),     # rejected at row 1, certified there
             ([7, 9, 0, 0], [True, False, True, True], False),     # row 1 needed and uncertified
             ([3, 9, 11, 4], [False, True, True, True], False),    # the first row is always needed
             ([7, 9, 11, 4], [True, True, True, True], True)]      # all accepted, bonus row certified
    for winner, certified, expected in cases:
        head._count(block, torch.tensor(winner), torch.tensor(certified))
        assert head.stats.per_step[-1] is expected, (winner, certified)
    assert head.stats.summary()["steps_without_fallback"] == 2 and head.stats.certified_rows == 12


def too_tight(weight, rank):
    """A planted fault: the low-rank part alone, residual term dropped (not a bound)."""
    bounds = REAL_BUILD(weight, rank)
    bounds.residuals = torch.zeros_like(bounds.residuals)
    bounds.row_norms = torch.zeros_like(bounds.row_norms)       # and no rounding slack either
    return bounds


@pytest.fixture(scope="module")
def prompts_file(pair, tmp_path_factory):
    from specpilot.models import load_tokenizer
    from specpilot.models.prompts import Prompt, encode_prompt

    tok = load_tokenizer(pair.target_dir)
    assert encode_prompt(tok, Prompt(id="p", text="def add(a, b):\n    return"))
    path = tmp_path_factory.mktemp("certified_cli") / "prompts.jsonl"
    path.write_text(json.dumps({"id": "p", "prompt": "def add(a, b):\n    return"}) + "\n")
    return path


def test_cli_verify_passes_the_certified_head_and_fails_a_too_tight_bound(pair, prompts_file, monkeypatch, capsys):
    args = ["verify", "--target", str(pair.target_dir), "--drafter", str(pair.drafter_dir), "--prompts",
            str(prompts_file), "--max-new-tokens", "24", "--device", "cpu", "--dtype", "fp32",
            "--two-level", "certified-head"]
    assert main(args) == 0, capsys.readouterr().out[-3000:]
    assert capsys.readouterr().out.strip().splitlines()[-2].startswith("verdict: PASS")
    monkeypatch.setattr(certified_head.HeadBounds, "build", staticmethod(too_tight))
    assert main(args) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-2].startswith("verdict: FAIL: ") and "speculative output" in lines[-2], lines[-2]
