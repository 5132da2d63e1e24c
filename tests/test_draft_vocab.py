"""Reduced draft vocabulary (EngineConfig.draft_vocab, models/draft_vocab.py): the drafter proposes
only kept tokens, and outputs are identical to the full head's (the target verifies every draft).
CPU, fp32: the tiny random pair (drafts from a random ranking) and the zoo pair (a trained drafter,
its real ranking of frequent tokens, so acceptance genuinely moves)."""
import dataclasses

import pytest
import torch

from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import Pair, fresh_seed, loop_config
from specpilot import config as engine_config
from specpilot import settings
from specpilot.config import EngineConfig
from specpilot.engine import Engine
from specpilot.models import draft_vocab
from specpilot.models.draft_vocab import RANKING_FILE, ReducedDraftHead, TokenRanking


def test_ranking_orders_by_count_then_id_and_round_trips(tmp_path):
    r = TokenRanking.from_counts(torch.tensor([3, 0, 7, 3, 0]), "counted")
    assert r.ids == (2, 0, 3, 1, 4)
    back = TokenRanking.load(r.save(tmp_path / "r.json"))
    assert back == r


@pytest.mark.parametrize("ids, message", [((0, 1, 1), "exactly once"), ((0, 2), "exactly once")])
def test_a_ranking_must_cover_the_vocabulary_once(ids, message):
    with pytest.raises(ValueError, match=message):
        TokenRanking(ids, 3, "bad")


def test_bad_settings_are_named(tmp_path):
    with pytest.raises(ValueError, match="draft_vocab must be an int >= 0"):
        EngineConfig(draft_vocab=-1)
    with pytest.raises(ValueError, match="two_level must be one of"):
        EngineConfig(two_level="yes")
    with pytest.raises(ValueError, match="prefix-first' runs on the batched engine only"):
        EngineConfig(two_level="prefix-first")
    with pytest.raises(FileNotFoundError, match="token ranking"):
        TokenRanking.load(tmp_path / "missing.json")
    (tmp_path / "junk.json").write_text("{}")
    with pytest.raises(ValueError, match="not a token ranking"):
        TokenRanking.load(tmp_path / "junk.json")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return Pair(tmp_path_factory.mktemp("draft_vocab"), "tiny-qwen3", [0, 2], block_size=8, seed=fresh_seed())


def random_ranking(pair, seed) -> TokenRanking:
    vocab = pair.target.config.vocab_size
    ids = torch.randperm(vocab, generator=torch.Generator().manual_seed(seed)).tolist()
    return TokenRanking(tuple(ids), vocab, "random permutation (test)")


def test_reduced_head_is_the_full_head_at_the_kept_rows_and_minus_inf_elsewhere(pair):
    vocab, n = pair.target.config.vocab_size, 37
    ranking = random_ranking(pair, fresh_seed())
    head = ReducedDraftHead(pair.target.lm_head, torch.tensor(ranking.ids[:n]), vocab)
    hidden = torch.randn(2, 5, pair.target.config.hidden_size)
    logits = head.expand(head.logits(hidden))
    kept = torch.zeros(vocab, dtype=torch.bool)
    kept[list(ranking.ids[:n])] = True
    assert torch.equal(head.ids, torch.sort(torch.tensor(ranking.ids[:n])).values)
    torch.testing.assert_close(logits[..., kept], pair.target.lm_head(hidden)[..., kept])
    assert torch.isneginf(logits[..., ~kept]).all()


def test_draft_vocab_needs_a_ranking_of_the_targets_vocabulary(pair, tmp_path):
    with pytest.raises(FileNotFoundError, match="token ranking"):
        Engine(pair.target, pair.drafter, max_seq_len=64, config=EngineConfig(draft_vocab=8))  # none in the folder
    wrong = TokenRanking(tuple(range(10)), 10, "too small").save(tmp_path / "small.json")
    with pytest.raises(ValueError, match="vocabulary of 10"):
        Engine(pair.target, pair.drafter, max_seq_len=64,
               config=EngineConfig(draft_vocab=8, draft_vocab_ranking=str(wrong)))
    ok = random_ranking(pair, 0).save(tmp_path / "ok.json")
    with pytest.raises(ValueError, match="draft_vocab=100000 must be in 1.."):
        Engine(pair.target, pair.drafter, max_seq_len=64,
               config=EngineConfig(draft_vocab=100000, draft_vocab_ranking=str(ok)))


@pytest.mark.parametrize("fused", [True, False])
def test_outputs_are_identical_to_the_full_head_and_drafts_stay_in_the_kept_set(pair, tmp_path, fused, monkeypatch):
    seed = fresh_seed()
    ranking = random_ranking(pair, seed)
    ranking.save(tmp_path / RANKING_FILE)
    monkeypatch.setattr(pair.drafter, "source_dir", str(tmp_path))        # the ranking beside the drafter
    n = 24
    kept = set(ranking.ids[:n])
    reduced = Engine(pair.target, pair.drafter, max_seq_len=256, config=EngineConfig(draft_vocab=n))
    proposed = []
    real_expand = ReducedDraftHead.expand

    def recording_expand(self, kept_logits):
        full = real_expand(self, kept_logits)
        proposed.extend(full.argmax(-1).reshape(-1).tolist())
        return full

    monkeypatch.setattr(ReducedDraftHead, "expand", recording_expand)
    for length in (5, 11):
        prompt = pair.random_prompt(length)
        with loop_config(reduced, fused_steps=fused), loop_config(pair.engine, fused_steps=fused):
            full = pair.engine.generate_spec(prompt, 40, stop_ids=())
            mine = reduced.generate_spec(prompt, 40, stop_ids=())
        ar = pair.engine.generate_ar(prompt, 40, stop_ids=())
        assert mine.tokens == full.tokens == ar.tokens, f"seed {seed}"
    assert proposed and set(proposed) <= kept, f"seed {seed}: drafts outside the kept set"
    assert engine_config.current().draft_vocab == 0               # the engine's config stayed inside its forwards


zoo = pytest.mark.skipif(settings.zoo_pair() is None, reason="the zoo pair (SPECPILOT_ZOO) is not present")


@zoo
def test_zoo_pair_outputs_identical_with_the_frequent_tokens_only(tmp_path):
    """The real ranking (token counts of held-out zoo prompts), N = 512 of 8192: identical tokens to the
    full head, and the acceptance lengths move (the mechanism is live, not a no-op)."""
    from specpilot.commands.draft_vocab import count_tokens
    from specpilot.models import load_drafter, load_target, load_tokenizer
    from specpilot.models.prompts import encode_prompt, read_prompts

    tdir, ddir = settings.zoo_pair()
    tok = load_tokenizer(tdir)
    rows = read_prompts(tdir.parent / "prompts" / "pystdlib.jsonl")
    counts = count_tokens([encode_prompt(tok, r) for r in rows[40:]], 8192)
    path = TokenRanking.from_counts(counts, "pystdlib[40:]").save(tmp_path / "ranking.json")
    target = load_target(tdir, dtype=torch.float32)
    drafter = load_drafter(ddir, target)
    full = Engine(target, drafter, max_seq_len=512)
    small = Engine(target, drafter, max_seq_len=512, config=EngineConfig(draft_vocab=512, draft_vocab_ranking=str(path)))
    moved = False
    for row in rows[:3]:
        prompt = encode_prompt(tok, row)[-96:]
        a, b = full.generate_spec(prompt, 48, stop_ids=()), small.generate_spec(prompt, 48, stop_ids=())
        assert a.tokens == b.tokens
        moved |= a.acceptance_lengths != b.acceptance_lengths
    assert moved, "N = 512 of 8192 changed no acceptance length on 3 prompts: is the reduced head live?"
    whole = Engine(target, drafter, max_seq_len=512, config=EngineConfig(draft_vocab=8192, draft_vocab_ranking=str(path)))
    prompt = encode_prompt(tok, rows[0])[-96:]
    a, b = full.generate_spec(prompt, 48, stop_ids=()), whole.generate_spec(prompt, 48, stop_ids=())
    assert (a.tokens, a.acceptance_lengths) == (b.tokens, b.acceptance_lengths)    # N = V: the same drafts


def test_config_fields_are_replaceable():
    c = dataclasses.replace(EngineConfig(), draft_vocab=16, draft_vocab_ranking="r.json")
    assert (c.draft_vocab, c.draft_vocab_ranking, c.two_level) == (16, "r.json", "off")
    assert draft_vocab.reduced_head_for(object(), EngineConfig()) is None
