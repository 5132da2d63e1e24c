"""The cost model's two-level terms (cost/shapes.py step_components, cost/two_level.py): a reduced draft
vocabulary shrinks the draft LM head to N rows plus a vocabulary scan; the certified head replaces the
verify LM head by level 1 plus the exact head at the fallback rate; the break-evens follow from them."""
import pytest

from specpilot.cost.ceilings import Ceilings
from specpilot.cost.gaps import ceiling_of, work
from specpilot.cost.shapes import SHORTLIST, step_components
from specpilot.cost.two_level import best_draft_vocab, prefix_first_rows, preset_shapes, projection, step_ceilings

H100 = Ceilings("cuda", "stated", 3.35e12, 9.89e14, 2e-6, "bfloat16")


@pytest.fixture(scope="module")
def shapes():
    return preset_shapes("qwen3-8b", 5)


def by_name(components):
    return {(c.step, c.name): c for c in components}


def test_draft_vocab_and_certified_terms(shapes):
    target, drafter = shapes
    full = by_name(step_components(target, drafter, 5, 1, 16, 1024))
    mine = by_name(step_components(target, drafter, 5, 1, 16, 1024, draft_vocab=32768, certified=(512, 0.25)))
    assert full[("draft", "draft.lm_head")].n == 151936 and mine[("draft", "draft.lm_head")].n == 32768
    assert ("draft", "draft.vocab_expand") in mine and ("draft", "draft.vocab_expand") not in full
    assert ("verify", "lm_head") in full and ("verify", "lm_head") not in mine
    level1, short, fallback = (mine[("verify", n)] for n in ("lm_head.level1", "lm_head.shortlist", "lm_head.fallback"))
    assert (level1.n, level1.k) == (151936, 512) and short.n == 16 * (SHORTLIST + 1)
    assert (fallback.n, fallback.k, fallback.count) == (151936, 4096, 0.25)


def test_break_evens_follow_from_the_step_ceilings(shapes):
    target, drafter = shapes
    p = projection(target, drafter, 5, 16, 6.49, H100, [0, 8192, 65536], [256, 1024])
    full = p["steps_full"]
    rows = {r["draft_vocab"]: r for r in p["draft_vocab"]}
    assert rows[0]["break_even_tau_ratio"] == pytest.approx(1.0)
    for n in (8192, 65536):
        s = step_ceilings(target, drafter, 5, 16, H100, draft_vocab=n)
        assert rows[n]["break_even_tau_ratio"] == pytest.approx((s["draft"] + full["verify"]) /
                                                                (full["draft"] + full["verify"]))
    assert rows[8192]["draft_over_full"] < rows[65536]["draft_over_full"] < 1.0
    head = ceiling_of(*work(by_name(step_components(target, drafter, 5, 1, 16, 1024))[("verify", "lm_head")],
                            "cuda", target, drafter, 1, 1024, "bf16"), H100)[0]
    for r in p["certified_head"]:
        level1 = step_ceilings(target, drafter, 5, 16, H100, certified=(r["rank"], 0.0))["verify"] - (full["verify"] - head)
        assert r["level1_over_head"] == pytest.approx(level1 / head)
        assert r["break_even_fallback_rate"] == pytest.approx(1 - level1 / head)
    assert p["certified_head"][0]["level1_over_head"] < p["certified_head"][1]["level1_over_head"]


def test_an_unknown_preset_is_named():
    with pytest.raises(ValueError, match="unknown preset 'nope'"):
        preset_shapes("nope", 5)


def test_best_draft_vocab_keeps_the_full_head_unless_tokens_per_second_rise():
    steps = {0: (1.0, 4.0), 8192: (0.7, 4.0), 32768: (0.75, 4.0)}
    # 8192 loses 8 % of tau, more than its 6 % cheaper step; 32768 loses 2 % for 5 %: it wins
    n, gain = best_draft_vocab(steps, {0: 6.0, 8192: 6.0 * 0.92, 32768: 6.0 * 0.98})
    assert n == 32768 and gain == pytest.approx(0.98 * 5.0 / 4.75)
    assert best_draft_vocab(steps, {0: 6.0, 8192: 5.0, 32768: 5.0})[0] == 0
    assert best_draft_vocab({0: (1.0, 4.0), 64: (1.0, 4.0)}, {0: 6.0, 64: 6.0})[0] == 0   # a tie: full head
    with pytest.raises(ValueError, match="full head"):
        best_draft_vocab({8192: (1.0, 1.0)}, {8192: 1.0})
    with pytest.raises(ValueError, match=r"sizes \[8192\]"):
        best_draft_vocab({0: (1.0, 1.0), 8192: (1.0, 1.0)}, {0: 1.0})


def test_prefix_first_rows_count_a_second_pass_only_after_a_fully_accepted_prefix():
    # block 16: pass 1 is 4 rows judging drafts 1..4; acceptance 5 (4 drafts + bonus) needs pass 2
    # (12 rows), 4 does not
    r = prefix_first_rows([1, 4, 5, 16], 16, 4)
    assert r["second_pass_share"] == 0.5 and r["rows_per_step"] == (4 + 4 + 16 + 16) / 4
    with pytest.raises(ValueError, match="prefix 16 must be in 1..15"):
        prefix_first_rows([3], 16, 16)
    with pytest.raises(ValueError, match="at least one"):
        prefix_first_rows([], 16, 4)
